"""The torch engine: batched generation with a KV cache for TinyGPT or any Hugging Face causal LM
(`model: {kind: hf}`, built from its config; every weight comes from load_weights), on CPU or GPU.

Each batch is prefilled with prompt + prefix (left padded), then decoded one token per step for all
live sequences. Token t of a response is drawn by contracts.sampling.sample from (request seed, t),
where t counts from the start of the response (prefix included), so a response continued here from a
prefix produced elsewhere gets the tokens it would have got had it never moved. In float64 that holds
bit for bit in practice; in float32, batch shape can flip a near-tie.

Speculative decoding (rollout.speculative, README "Speculative decoding"): each decode step may feed a
live row its last token plus up to K drafted ones (models/drafting.py; K from the pure rule in
contracts/speculation.py, from this engine's measured acceptance and the pass's cost: every row
of the static batch, finished or not, is computed, so a full batch decodes plain),
right-aligned and masked to the step's widest draft. Every fed position is sampled with the seeded rule
at its response position; drafted tokens are kept left to right while each equals the token sampled
where it stands, plus the sampled token at the first miss, so the tokens are the ones plain decoding
draws. Rejected drafts stay in the KV cache, masked out for good (positions are explicit, so the gaps
change nothing). The engine stays static-batch: a batch runs to its longest response.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import numpy as np
import torch

from rlboost.contracts.engine import DraftCounts, FinishReason, GenRequest, OnTokens, check_requests
from rlboost.contracts.sampling import sample
from rlboost.contracts.spec import ModelSpec, SpeculativeSpec
from rlboost.contracts.speculation import AcceptanceMeter, PassCost, batch_step_cost, draft_length
from rlboost.models import sampling_torch
from rlboost.models.drafting import BatchDrafter
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
        speculative: SpeculativeSpec | None = None,
        timer: Callable[[], float] = time.perf_counter,  # times decode passes (PassCost); tests inject one
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
        self._adapters = None  # model.lora: the merger of each version's adapters into the base weights
        # Until the first load_weights the engine holds a fixed-seed random init (the global RNG
        # is left alone), so even that is reproducible.
        if self.hf:
            from rlboost.models import hf

            if model_spec.lora is not None:  # versions carry only adapters: the base comes from model.path
                from rlboost.models.lora import AdapterMerger

                self.model = hf.from_pretrained(model_spec, self.dtype, self.device)
                self._adapters = AdapterMerger(self.model, model_spec.lora.scale)
            else:
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
        self.speculative = speculative or SpeculativeSpec()
        self.meter = AcceptanceMeter()  # acceptance of this engine's drafts, for the draft length
        # a forward pass's cost by the tokens it feeds: measured on this engine's decode passes, with a
        # memory-bound prior (a pass over up to max_batch tokens costs one decode step) until then
        self.pass_cost = PassCost(batch_step_cost(max_batch))
        self.timer, self.fed_tokens = timer, 0  # fed_tokens: the tokens of the pass under way
        self.drafts: dict[str, DraftCounts] = {}  # per request of its calls; the worker reports and removes them

    def _forward(
        self, idx: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, past: object, last: int = 1
    ) -> tuple:
        """Logits of the `last` positions [B, last, V] and the new cache, for either model kind."""
        if self.hf:
            from rlboost.models import hf

            logits, past = hf.forward(self.model, idx, positions, mask, past, use_cache=True, last_only=last)
        else:
            logits, past = self.model(idx, positions, mask, past)
        return logits[:, -last:], past

    def _sample(self, logits: torch.Tensor, seeds: np.ndarray, positions: np.ndarray, sampling: tuple):
        """contracts.sampling's rule at sampling = (temperature, top_k, top_p); on an accelerator computed
        there (same noise, bit for bit)."""
        if self.device.type == "cpu":
            toks, lps = sample(logits.double().numpy(), seeds, positions, *sampling)
            return toks.tolist(), lps.tolist()
        toks, lps = sampling_torch.sample(
            logits,
            torch.from_numpy(seeds.astype(np.int64)).to(self.device),
            torch.from_numpy(positions.astype(np.int64)).to(self.device),
            *sampling,
        )
        return toks.tolist(), lps.tolist()

    def _sample_fed(
        self, logits: torch.Tensor, rows: list[int], drafted: list[int], seeds: np.ndarray, starts: list[int],
        sampling: tuple,
    ) -> dict[int, list[tuple[int, float]]]:
        """(token, logprob) at every fed position of `rows` (logits [B, width, V], right-aligned): a row
        with d drafted tokens has d + 1, the j-th drawn at response position start + j with the request's
        seed, whatever was fed before it."""
        width = logits.shape[1]
        flat = [(i, j) for i, d in zip(rows, drafted) for j in range(d + 1)]
        cols = [width - 1 - d + j for i, d in zip(rows, drafted) for j in range(d + 1)]
        rows_t = torch.tensor([i for i, _ in flat], device=self.device)
        pos = np.array([p + j for p, d in zip(starts, drafted) for j in range(d + 1)], dtype=np.uint64)
        toks, lps = self._sample(
            logits[rows_t, torch.tensor(cols, device=self.device)], seeds[[i for i, _ in flat]], pos, sampling
        )
        out: dict[int, list[tuple[int, float]]] = {}
        for (i, _), tok, lp in zip(flat, toks, lps, strict=True):
            out.setdefault(i, []).append((tok, lp))
        return out

    def load_weights(self, version: int, tensors: Mapping[str, object]) -> None:
        """Copy a full set of weights into the existing module, casting to the compute dtype.

        Everything is validated before anything is copied, so a bad set leaves the old weights. With
        model.lora the set is a version's adapters, merged into the base weights (models/lora.py)."""
        if self._adapters is not None:
            self._adapters.load(tensors)
            self.version = version
            return
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
        top_k: int = 0,
        top_p: float = 1.0,
    ) -> dict[str, FinishReason]:
        check_requests(requests, self.block_size)
        reasons: dict[str, FinishReason] = {}
        for start in range(0, len(requests), self.max_batch):
            batch = requests[start : start + self.max_batch]
            reasons.update(self._generate_batch(batch, on_tokens, should_abort, (temperature, top_k, top_p)))
        return reasons

    def _draft(self, drafter: BatchDrafter | None, reqs: list[GenRequest], rows: list[int], made: list[int]):
        """Each live row's drafted tokens for this step: K from the acceptance measured so far and the
        cost of the forward pass. The static batch computes every one of its rows, finished or not, so
        K drafted tokens cost a pass over len(reqs) * (K + 1) tokens: a batch that fills the engine
        decodes plain, a smaller one (e.g. a step's tail, migrated to an engine of its own) drafts."""
        if drafter is None or not rows or not self.pass_cost.knows_plain(len(reqs)):
            return {}  # (a plain pass first: the widths drafting feeds are priced against one)
        scale = len(reqs) / len(rows)  # the pass's tokens per live row's token
        k = draft_length(
            self.meter.rate, len(rows), self.speculative.max_tokens, lambda n: self.pass_cost(round(n * scale))
        )
        if k == 0:
            return {}
        out = {}
        for i in rows:
            # the step yields up to len(draft) + 1 tokens: never past the budget
            d = drafter.propose(i, min(k, reqs[i].max_new_tokens - made[i] - 1))
            if d:
                out[i] = d
        return out

    @torch.inference_mode()
    def _generate_batch(
        self,
        reqs: list[GenRequest],
        on_tokens: OnTokens,
        should_abort: Callable[[str], bool],
        sampling: tuple,  # (temperature, top_k, top_p)
    ) -> dict[str, FinishReason]:
        reasons: dict[str, FinishReason] = {r.rid: "length" for r in reqs if r.max_new_tokens <= 0}
        made = [0] * len(reqs)  # tokens generated here, per row
        seeds = np.array([r.seed for r in reqs], dtype=np.uint64)
        idx, positions, mask = left_pad([[*r.prompt, *r.prefix] for r in reqs], self.device)
        method = self.speculative.method
        drafter = BatchDrafter(method, reqs) if method != "none" else None
        if drafter is not None:
            for r in reqs:
                self.drafts[r.rid] = DraftCounts()
        drafts: dict[int, list[int]] = {}  # row -> the tokens drafted after its last one, fed this step
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
            width = 1 + max((len(d) for d in drafts.values()), default=0)  # the fed columns with logits
            # timed: a decode pass where the engine drafts (the first pass prefills the prompts)
            timed = past is not None and drafter is not None
            self.fed_tokens = len(reqs) * width
            t0 = self.timer() if timed else 0.0
            logits, past = self._forward(idx, positions, mask, past, width)
            starts = [reqs[i].position0 + made[i] for i in active]
            sampled = self._sample_fed(logits, active, [len(drafts.get(i, ())) for i in active], seeds, starts,
                                       sampling)
            if timed:  # sampled to Python lists: the pass is done, on any device
                self.pass_cost.observe(self.fed_tokens, self.timer() - t0)
            keep = torch.ones((len(reqs), width), dtype=torch.bool, device=self.device)
            next_tok: list[list[int]] = [[] for _ in reqs]
            for i in active:
                r, d, s = reqs[i], drafts.get(i, []), sampled[i]
                # keep drafted tokens left to right while each is the token sampled where it stands,
                # then the sampled token at the first miss (or after the last drafted one)
                n_ok = 0
                while n_ok < len(d) and d[n_ok] == s[n_ok][0]:
                    n_ok += 1
                if d:
                    keep[i, width - len(d) + n_ok :] = False  # rejected drafts: in the cache, never seen again
                    self._count(r.rid, len(d), n_ok)
                new = s[: n_ok + 1]
                for m, (tok, _) in enumerate(new):  # stop at EOS or the budget
                    if tok == self.eos_id or made[i] + m + 1 >= r.max_new_tokens:
                        new = new[: m + 1]
                        break
                ids, lps_new = [t for t, _ in new], [lp for _, lp in new]
                on_tokens(r.rid, r.position0 + made[i], ids, lps_new)
                made[i] += len(ids)
                if drafter is not None:
                    drafter.extend(i, ids)
                if ids[-1] == self.eos_id:
                    reasons[r.rid] = "eos"
                elif made[i] >= r.max_new_tokens:
                    reasons[r.rid] = "length"
                else:
                    next_tok[i] = [ids[-1]]
            if drafts:
                mask = torch.cat([mask[:, :-width], mask[:, -width:] & keep], dim=1)
            live = [i for i in range(len(reqs)) if reqs[i].rid not in reasons]
            drafts = self._draft(drafter, reqs, live, made)
            for i, d in drafts.items():
                next_tok[i] = [*next_tok[i], *d]
            # Feed each live row its newest token and its draft, right-aligned; finished rows and the
            # rest of the width get masked-out PADs so the batch keeps its shape
            w = 1 + max((len(d) for d in drafts.values()), default=0)
            feed, pos, real = [[PAD] * w for _ in reqs], [[0] * w for _ in reqs], [[False] * w for _ in reqs]
            for i in live:
                n, p0 = len(next_tok[i]), len(reqs[i].prompt) + len(reqs[i].prefix) + made[i] - 1
                feed[i][w - n :], pos[i][w - n :], real[i][w - n :] = next_tok[i], range(p0, p0 + n), [True] * n
            idx = torch.tensor(feed, device=self.device)
            positions = torch.tensor(pos, device=self.device)
            mask = torch.cat([mask, torch.tensor(real, device=self.device)], dim=1)

    def _count(self, rid: str, drafted: int, accepted: int) -> None:
        c = self.drafts[rid]
        c.drafted, c.accepted, c.passes = c.drafted + drafted, c.accepted + accepted, c.passes + 1
        self.meter.update(drafted, accepted)
