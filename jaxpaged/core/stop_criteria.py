"""The stop conditions the scheduler enforces after each generated token (stop strings are the engine's)."""

from .request import Request, RequestStatus


def check_stop(request: Request, max_model_len: int) -> bool:
    """Mark the request finished if its newest token ends it; True if it did.

    EOS (unless ignore_eos) and stop_token_ids end a request only once min_tokens are generated, and are
    checked before the length limits: a request whose last allowed token is EOS finished "stop".
    """
    num_output_tokens = len(request.output_token_ids)
    if num_output_tokens >= request.min_tokens:
        last_token_id = request.output_token_ids[-1]
        if last_token_id == request.eos_token_id and not request.ignore_eos:
            request.status = RequestStatus.FINISHED_STOPPED
            return True
        if last_token_id in request.stop_token_ids:
            request.status = RequestStatus.FINISHED_STOPPED
            request.stop_reason = last_token_id
            return True
    if reaches_length_limit(request, max_model_len):
        request.status = RequestStatus.FINISHED_LENGTH
        return True
    return False


def reaches_length_limit(request: Request, max_model_len: int, num_more_tokens: int = 0) -> bool:
    """Whether the request is at max_tokens or max_model_len once `num_more_tokens` more are appended (the
    scheduler asks with the tokens still in flight, to plan no step past them)."""
    return (len(request.output_token_ids) + num_more_tokens >= request.max_tokens
            or len(request.all_token_ids) + num_more_tokens >= max_model_len)
