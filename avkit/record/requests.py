"""Workload prompts -> engine requests: follow-ups first, then the dataset furthest behind (docs/workloads.md,
"How avkit record asks them"). Request ids: `<dataset>/<prompt id>[/turn<n>]`."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from pathlib import Path

from avkit.config import RecordConfig, SamplingConfig
from avkit.runtime.request import Request
from avkit.workloads import WORKLOADS, Prompt, load_workload


@dataclass(frozen=True)
class Turn:
    """A request plus what is needed to ask the prompt's next turn after it."""

    request: Request
    prompt: Prompt
    turn: int  # 1-based
    messages: tuple[dict, ...]  # the conversation rendered into request.prompt_ids


class PromptQueue:
    """Hands out the next request. `done`: finished request id -> output ids (a resumed generations table);
    those turns are skipped and their follow-ups rebuilt from the stored answer."""

    def __init__(self, config: RecordConfig, tokenizer, done: dict[str, list[int]] | None = None):
        self.config = config
        self.tokenizer = tokenizer
        self.done = dict(done or {})
        self.sampling = SamplingConfig(temperature=config.sampling.temperature, top_p=config.sampling.top_p,
                                       max_new_tokens=config.sampling.max_new_tokens)
        self._sources = {name: iter(load_workload(name, None, config.decoding.seed)) for name in config.dataset}
        # the rows' `dataset`: a workload's name, or a JSONL file's stem
        self._labels = {name: name if name in WORKLOADS else Path(name).stem for name in config.dataset}
        self._taken = dict.fromkeys(self._sources, 0)  # first turns admitted (or already done)
        self._followups: deque[Turn] = deque()
        self.skipped_long = 0

    def _make(self, prompt: Prompt, turn: int, messages: tuple[dict, ...]) -> Turn | None:
        ids = prompt.token_ids(self.tokenizer, messages)
        if len(ids) > self.config.max_prompt_tokens:
            self.skipped_long += 1
            return None
        rid = f"{prompt.dataset}/{prompt.prompt_id}" + (f"/turn{turn}" if turn > 1 else "")
        req = Request(rid, ids, self.sampling, dataset=prompt.dataset)
        return Turn(req, prompt, turn, messages)

    def finished(self, turn: Turn, output_ids: list[int]) -> None:
        """Queue the prompt's next turn (if any) after `turn` produced `output_ids`."""
        if turn.turn > len(turn.prompt.followups):
            return
        answer = self.tokenizer.decode(output_ids)
        messages = turn.messages + ({"role": "assistant", "content": answer},
                                    {"role": "user", "content": turn.prompt.followups[turn.turn - 1]})
        nxt = self._make(turn.prompt, turn.turn + 1, messages)
        if nxt is None:
            return
        if nxt.request.request_id in self.done:  # resumed: skip it, but keep walking the conversation
            self.finished(nxt, self.done[nxt.request.request_id])
        else:
            self._followups.append(nxt)

    def _next_first_turn(self, name: str) -> Turn | None:
        """The dataset's next admissible first turn (None when its prompts are used up)."""
        for prompt in self._sources[name]:
            if self._taken[name] >= self.config.num_prompts:
                return None
            first = self._make(prompt, 1, prompt.messages)
            if first is None:
                continue
            self._taken[name] += 1
            rid = first.request.request_id
            if rid in self.done:
                self.finished(first, self.done[rid])
                if self._followups:
                    return self._followups.popleft()
                continue
            return first
        return None

    def pop(self, full: set[str] = frozenset(), labelled: dict[str, int] | None = None) -> Turn | None:
        """The next request to admit (None: every dataset exhausted or `full`): the dataset with the fewest
        `labelled` slots goes first, then the fewest admitted prompts."""
        if self._followups:
            return self._followups.popleft()
        labelled = labelled or {}
        names = [n for n in self._sources if self._labels[n] not in full and self._taken[n] < self.config.num_prompts]
        names.sort(key=lambda n: (labelled.get(self._labels[n], 0), self._taken[n]))
        for name in names:
            turn = self._next_first_turn(name)
            if turn is not None:
                return turn
        return None

    def expected(self) -> int:
        """Requests this run aims at (first turns + follow-ups), for the progress bar total."""
        return self.config.num_prompts * (len(self._sources) + ("mtbench" in self._sources))
