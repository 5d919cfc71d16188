"""Run under vLLM's Python by tests/test_vllm_record.py: vLLM's offline engine stepped, and what each step did.

    VLLM_PYTHON tests/vllm_steps.py SPEC.json OUT.json

SPEC: avkit.engines.vllm.offline.make_llm's keys (`k_schedule` included), `prompts` [[request id, prompt ids]],
`arrivals` {engine step: requests added before it}, `max_tokens`, `stop_token_ids` (greedy requests).
OUT: `outputs` (request id -> its output ids), `start` (vLLM's spec-decode counters before the first step) and
`steps`: per engine step the requests vLLM scheduled (hooks.py's count, the batch size Dynamic SD looks K up by)
and the counters after it.
"""

import json
import sys

from vllm import SamplingParams
from vllm.inputs import TokensPrompt
from vllm.sampling_params import RequestOutputKind

from avkit.engines.vllm import hooks
from avkit.engines.vllm.offline import counters, make_llm

spec = json.loads(open(sys.argv[1]).read())
rec = hooks.install()  # timing only: the recorder stays inactive
llm = make_llm(spec)
engine = llm.llm_engine
sp = SamplingParams(temperature=0.0, max_tokens=int(spec["max_tokens"]), stop_token_ids=spec["stop_token_ids"],
                    output_kind=RequestOutputKind.DELTA, detokenize=False)
queue = list(spec["prompts"])
outputs: dict[str, list[int]] = {rid: [] for rid, _ in queue}
start, steps = counters(llm), []
rec.take_timing()
while queue or engine.has_unfinished_requests():
    for _ in range(min(int(spec["arrivals"].get(str(len(steps)), 0)), len(queue))):
        rid, ids = queue.pop(0)
        engine.add_request(rid, TokensPrompt(prompt_token_ids=list(ids)), sp)
    for o in engine.step():
        outputs[o.request_id].extend(o.outputs[0].token_ids)
    steps.append({"batch": rec.take_timing()[2], "counters": counters(llm)})
with open(sys.argv[2], "w") as fh:
    json.dump({"outputs": outputs, "start": start, "steps": steps}, fh)
