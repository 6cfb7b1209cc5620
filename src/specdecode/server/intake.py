"""An API request checked against the model and the server's routes, and turned into the engine's
Request: the model name, the prompt's token ids and room, the route (the request's speculative
override on the route for its task), sampling, penalties and a response_format's grammar. What does
not fit is an ApiError (400, or 404 for another model's name) before anything is queued."""

from __future__ import annotations

from specdecode import engine as eng
from specdecode.api.structured import StructuredOutputs, check_ignore_eos
from specdecode.core.sampling import Warp
from specdecode.core.tasks import classify
from specdecode.decoding.config import Route
from specdecode.decoding.penalties import Penalties
from specdecode.drafters import parse
from specdecode.errors import UserError
from specdecode.server.schemas import ApiError, ChatRequest, CompletionRequest, ResponseFormat, Speculative


def resolve_route(spec: Speculative | None, route: Route) -> Route:
    """The request's speculative override on top of the engine's route for its task: the request's
    drafter text is parsed here, once (a malformed one is a UserError)."""
    if spec is None:
        return route
    if not spec.enabled:
        return Route(parse("none"), route.k, False)
    adaptive = route.adaptive if spec.adaptive is None else spec.adaptive
    return Route(parse(spec.drafter) if spec.drafter else route.drafter, spec.k or route.k, adaptive)


class Intake:
    """The server's checks of a completion or chat request (model_name: the one model it serves;
    the engine's routes give a task's drafter and k; timeout_s: each request's)."""

    def __init__(self, engine: eng.Engine, model_name: str, timeout_s: float | None):
        self.engine, self.model_name, self.timeout_s = engine, model_name, timeout_s
        self.context, self.vocab = engine.model.max_length, engine.model.vocab_size

    def request(
        self, req: CompletionRequest | ChatRequest, ids: list[int], task_text: str, rid: str
    ) -> eng.Request:
        """req with its prompt's token ids, the text its task is classified from (when it names
        none) and its request id -> the engine's Request for its first sample."""
        if req.model is not None and req.model != self.model_name:
            raise ApiError(
                404,
                f"model {req.model!r} not found; this server serves {self.model_name!r}",
                "not_found_error",
                "model",
                "model_not_found",
            )
        max_tokens = self._max_tokens(req, ids)
        task = req.task or classify(task_text)
        try:
            route = resolve_route(req.speculative, self.engine.route(task))
            self.engine.pool.template(route.drafter)  # unknown or not loaded -> 400
            params = Warp(req.temperature, max(req.top_k, 0), req.top_p)
        except UserError as e:
            raise ApiError(400, str(e), param="speculative.drafter") from None
        if isinstance(req, ChatRequest) and req.top_logprobs is not None and not req.logprobs:
            raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        grammar = self._grammar(req.response_format)
        if grammar is not None:
            try:
                check_ignore_eos(req.ignore_eos, "a response_format")
            except UserError as e:
                raise ApiError(400, str(e), param="ignore_eos") from None
        penalties = Penalties(req.presence_penalty, req.frequency_penalty, req.repetition_penalty)
        return eng.Request(
            ids,
            params,
            max_tokens,
            stop=tuple(req.stop or ()),
            seed=req.seed,
            drafter=route.drafter,
            k=route.k,
            adaptive=route.adaptive,
            task=task,
            ignore_eos=req.ignore_eos,
            timeout_s=self.timeout_s,
            penalties=penalties if penalties.active else None,
            grammar=grammar,
            logprobs=req.top_logprobs_asked(),
            request_id=rid,
        )

    def _max_tokens(self, req: CompletionRequest | ChatRequest, ids: list[int]) -> int:
        """The tokens the request may generate: its max_(completion_)tokens, by default 16 for a
        completion and the context's room for a chat (within the KV cache memory); the prompt and they
        must fit the context."""
        if not ids:
            raise ApiError(400, "prompt is empty after tokenization", param="prompt")
        if any(not 0 <= t < self.vocab for t in ids):
            raise ApiError(400, f"token ids must be in [0, {self.vocab})", param="prompt")
        max_tokens = getattr(req, "max_completion_tokens", None) or req.max_tokens
        if max_tokens is None:
            # a chat's default: the context's room, as far as the KV cache memory could hold it
            room = max(1, self.engine.core.room(len(ids)))  # none at all: the engine's 400 says why
            max_tokens = 16 if isinstance(req, CompletionRequest) else min(self.context - len(ids), room)
        if max_tokens < 1 or len(ids) + max_tokens > self.context:
            raise ApiError(
                400,
                f"prompt ({len(ids)} tokens) + max_tokens ({max_tokens}) exceeds the model's "
                f"context of {self.context} tokens",
                param="max_tokens",
                code="context_length_exceeded",
            )
        return max_tokens

    def _grammar(self, fmt: ResponseFormat | None) -> str | None:
        """The request's response_format as a compiled grammar (None: free text); a bad one is a 400."""
        if fmt is None or fmt.type == "text":
            return None
        try:  # the API's one reading of a response_format (api/structured.py)
            structured = StructuredOutputs.from_response_format(
                fmt.model_dump(by_alias=True, exclude_none=True)
            )
            return structured.compile(self.engine.grammars())
        except UserError as e:
            raise ApiError(400, str(e), param="response_format") from None
