"""The torch engine: batched generation with a KV cache for TinyGPT or any Hugging Face causal LM
(`model: {kind: hf}`, built from its config; every weight comes from load_weights), on CPU or GPU.

Each batch is prefilled with prompt + prefix (left padded), then decoded one token per step for all
live sequences. Token t of a response is drawn by contracts.sampling.sample from (request seed, t),
where t counts from the start of the response (prefix included), so a response continued here from a
prefix produced elsewhere gets the tokens it would have got had it never moved. In float64 that holds
bit for bit in practice; in float32, batch shape can flip a near-tie.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import torch

from rlboost.contracts.engine import FinishReason, GenRequest, OnTokens, check_requests
from rlboost.contracts.sampling import sample
from rlboost.contracts.spec import ModelSpec
from rlboost.models import sampling_torch
from rlboost.models.tiny_gpt import TinyGPT, from_spec, left_pad
from rlboost.models.vocab import EOS, PAD

_DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}


class TorchEngine:
    name = "torch"

    def __init__(
        self,
        model_spec: ModelSpec,
        dtype: str = "float32",
        max_batch: int = 64,
        device: str | None = None,
        eos_id: int | None = None,
    ) -> None:
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if device is None:  # tiny-gpt stays on the CPU (the local default); hf models take a GPU if any
            device = "cuda" if model_spec.kind == "hf" and torch.cuda.is_available() else "cpu"
        self.dtype, self.max_batch, self.device = _DTYPES[dtype], max_batch, torch.device(device)
        self.version: int | None = None
        self.hf = model_spec.kind == "hf"
        # Until the first load_weights the engine holds a fixed-seed random init (the global RNG
        # is left alone), so even that is reproducible.
        if self.hf:
            from rlboost.models import hf

            self.model = hf.from_config(model_spec, self.dtype, self.device, seed=0)
            self.block_size = hf.max_model_len(model_spec, self.model.config)
            self.eos_id = eos_id if eos_id is not None else hf.eos_token_id(hf.load_tokenizer(model_spec))
        else:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(0)
                self.model = TinyGPT(from_spec(model_spec))
            self.block_size = model_spec.block_size
            self.eos_id = EOS if eos_id is None else eos_id
        self.model.to(device=self.device, dtype=self.dtype).eval().requires_grad_(False)
        self._params = dict(self.model.named_parameters())

    def _forward(self, idx: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, past: object) -> tuple:
        """Logits of the last position [B, V] and the new cache, for either model kind."""
        if self.hf:
            from rlboost.models import hf

            logits, past = hf.forward(self.model, idx, positions, mask, past, use_cache=True, last_only=True)
        else:
            logits, past = self.model(idx, positions, mask, past)
        return logits[:, -1], past

    def _sample(self, logits: torch.Tensor, seeds: np.ndarray, positions: np.ndarray, temperature: float):
        """contracts.sampling's rule; on an accelerator computed there (same noise, bit for bit)."""
        if self.device.type == "cpu":
            toks, lps = sample(logits.double().numpy(), seeds, positions, temperature)
            return toks.tolist(), lps.tolist()
        toks, lps = sampling_torch.sample(
            logits,
            torch.from_numpy(seeds.astype(np.int64)).to(self.device),
            torch.from_numpy(positions.astype(np.int64)).to(self.device),
            temperature,
        )
        return toks.tolist(), lps.tolist()

    def load_weights(self, version: int, tensors: Mapping[str, object]) -> None:
        """Copy a full set of weights into the existing module, casting to the compute dtype.

        Everything is validated before anything is copied, so a bad set leaves the old weights."""
        missing, extra = self._params.keys() - tensors.keys(), tensors.keys() - self._params.keys()
        if missing or extra:
            raise ValueError(f"weight names do not match: missing {sorted(missing)}, unexpected {sorted(extra)}")
        new = {name: torch.as_tensor(tensors[name]) for name in self._params}
        for name, t in new.items():
            if t.shape != self._params[name].shape:
                raise ValueError(f"{name}: shape {tuple(t.shape)} != {tuple(self._params[name].shape)}")
        with torch.no_grad():
            for name, p in self._params.items():
                p.copy_(new[name])
        self.version = version

    def generate(
        self,
        requests: list[GenRequest],
        on_tokens: OnTokens,
        should_abort: Callable[[str], bool],
        temperature: float = 1.0,
    ) -> dict[str, FinishReason]:
        check_requests(requests, self.block_size)
        reasons: dict[str, FinishReason] = {}
        for start in range(0, len(requests), self.max_batch):
            batch = requests[start : start + self.max_batch]
            reasons.update(self._generate_batch(batch, on_tokens, should_abort, temperature))
        return reasons

    @torch.inference_mode()
    def _generate_batch(
        self,
        reqs: list[GenRequest],
        on_tokens: OnTokens,
        should_abort: Callable[[str], bool],
        temperature: float,
    ) -> dict[str, FinishReason]:
        reasons: dict[str, FinishReason] = {r.rid: "length" for r in reqs if r.max_new_tokens <= 0}
        made = [0] * len(reqs)  # tokens generated here, per row
        seeds = np.array([r.seed for r in reqs], dtype=np.uint64)
        idx, positions, mask = left_pad([[*r.prompt, *r.prefix] for r in reqs], self.device)
        past = None
        while True:
            active = []
            for i, r in enumerate(reqs):
                if r.rid in reasons:
                    continue
                if should_abort(r.rid):
                    reasons[r.rid] = "aborted"
                else:
                    active.append(i)
            if not active:
                return reasons
            logits, past = self._forward(idx, positions, mask, past)
            resp_pos = np.array([reqs[i].position0 + made[i] for i in active], dtype=np.uint64)
            toks, lps = self._sample(logits[active], seeds[active], resp_pos, temperature)
            next_tok = [PAD] * len(reqs)
            for i, tok, lp, pos in zip(active, toks, lps, resp_pos.tolist(), strict=True):
                r = reqs[i]
                on_tokens(r.rid, pos, [tok], [lp])
                made[i] += 1
                next_tok[i] = tok
                if tok == self.eos_id:
                    reasons[r.rid] = "eos"
                elif made[i] >= r.max_new_tokens:
                    reasons[r.rid] = "length"
            # Feed each still-live row its new token; finished rows get a masked-out PAD so the
            # batch keeps its shape (their outputs are ignored from now on).
            live = [r.rid not in reasons for r in reqs]
            idx = torch.tensor(next_tok, device=self.device)[:, None]
            positions = torch.tensor(
                [len(r.prompt) + len(r.prefix) + made[i] - 1 if live[i] else 0 for i, r in enumerate(reqs)],
                device=self.device,
            )[:, None]
            mask = torch.cat([mask, torch.tensor(live, device=self.device)[:, None]], dim=1)
