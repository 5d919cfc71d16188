"""The server's warm-up: a throwaway engine runs two short requests before `/health` says `ok`.

What a first request would otherwise pay for happens here: loading the CPU kernels (built before the port
opened, `avkit/models/native.py`), the first forwards of both models and the first draws of the sampler.
One greedy and one sampled request (temperature 1, top-p 0.95) so both the argmax and the sampling path
run, with a draft model when there is one. The engine has no sink and the full-verification policy: nothing
is recorded, counted in /metrics or learned by the served policy's estimator.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

from avkit.config import EngineConfig, SamplingConfig

log = logging.getLogger("avkit.serve")

PROMPT_LEN = 4  # tokens of the warm-up prompt (ids 1..4, in every vocabulary)


def warm_up(target, draft, config: EngineConfig) -> float:
    """Run the warm-up requests to completion on a small engine of `config`'s K; seconds taken."""
    from avkit.runtime.engine import Engine  # lazy: torch (as build_state's models)
    from avkit.runtime.request import Request  # lazy: with the engine

    t0 = time.perf_counter()
    new = config.k + 2  # at least one full verify step
    small = replace(config, concurrency=2, max_len=min(config.max_len, PROMPT_LEN + new + 2 * (config.k + 1)))
    engine = Engine(target, draft if config.k > 0 else None, small)
    prompt = list(range(1, PROMPT_LEN + 1))
    engine.generate([Request("warm-up-greedy", prompt, SamplingConfig(temperature=0.0, max_new_tokens=new)),
                     Request("warm-up-sampled", prompt,
                             SamplingConfig(temperature=1.0, top_p=0.95, max_new_tokens=new, seed=0))])
    seconds = time.perf_counter() - t0
    log.info("warm-up done in %.1f s: ready", seconds)
    return seconds
