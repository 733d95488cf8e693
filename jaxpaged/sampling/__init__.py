"""Sampling: what a request asks for and how one token per sampling row is drawn.

params.py: SamplingParams (validated user options); batch.py: the rows' options as one device pytree;
sampler.py: the jitted sampler; token_sampler.py: its host side (rows in, ids and logprobs out);
bitmask.py + grammar/: structured outputs; prompt_logprobs.py and step_result.py: what comes back.
Nothing here imports the runner or the server.
"""
