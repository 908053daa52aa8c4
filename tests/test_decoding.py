"""Continuous batching (agents/decoding.py): rows that join a running batch decode as they would alone."""
from __future__ import annotations

import pytest
import torch

from _flaky import Flaky
from cowork_pipeline.services import tools_for

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # see conftest.py

TOOLS = tools_for(["mail_search", "mail_read", "crm_update_invoice"])


@pytest.fixture
def student(tiny_student):  # (conftest.py)
    return tiny_student


def conversations(n: int) -> list[list[dict]]:
    """``n`` conversations of different lengths (the first the longest)."""
    return [[{"role": "system", "content": "You are a helpful coworker."},
             {"role": "user", "content": "Find Clara's invoice " + "and check it again " * (n - k) + f"number {k}."}]
            for k in range(n)]


def decode_with_joins(agent, convs, schedule, limits, sampled):
    """Each conversation's turn, its row admitted before the step ``schedule`` gives it (steps count on while the
    batch is empty); the batch's size at each admission, and whether its first cache column is attended."""
    decoding = agent.decoding(temperature=1.0 if sampled else 0.0)
    got, step, sizes, pending = {}, 0, [], dict(schedule)
    while pending or decoding.live:
        if step in pending:
            decoding.admit([(i, agent.chat_prompt(convs[i], TOOLS, limits[i]), agent.matcher(TOOLS),
                             torch.Generator().manual_seed(100 + i) if sampled else None, limits[i])
                            for i in pending.pop(step)])
            # (no column that every row leaves masked is kept at the left: rows that left take theirs along)
            sizes.append((decoding.size, bool(decoding.full_attn[:, 0].any())))
        if decoding.live:
            for i, ids, out in decoding.step():
                got[i] = agent.generation(("chat", convs[i], TOOLS), ids, out)
        step += 1
    return [got[i] for i in range(len(convs))], sizes


@pytest.mark.parametrize("sampled", [True, False], ids=["sampled", "greedy"])
def test_rows_that_join_a_running_batch_decode_as_they_would_alone(student, sampled):
    """Rows join between steps: into a batch that runs (padded on the left to one width, or padding it), after rows
    that finished left it (their columns trimmed), and into a batch that emptied. Each row's tokens are those it
    draws alone, from its own random stream or greedily, under the offered tools' grammar, each to its own limit;
    its log-probs equal those alone."""
    from cowork_pipeline.agents.hf_agent import HFAgent

    agent = HFAgent(student, device="cpu", max_new_tokens=32, prefix_cache_mb=0)
    convs = conversations(6)
    limits = [4, 30, 12, 20, 6, 9]
    # 0 (the longest prompt, soon done) starts, 1 joins it; 2 joins after 0 left (the columns only 0 attended
    # are trimmed); 3 and 4 join together; 5 comes once every other row is done.
    got, sizes = decode_with_joins(agent, convs, {0: [0], 1: [1], 6: [2], 9: [3, 4], 80: [5]}, limits, sampled)
    alone = [agent.generate([(c, TOOLS)], temperature=1.0 if sampled else 0.0, max_new_tokens=n,
                            **({"seeds": [100 + i]} if sampled else {}))[0]
             for i, (c, n) in enumerate(zip(convs, limits))]
    assert [g.completion_ids for g in got] == [a.completion_ids for a in alone]
    for g, a in zip(got, alone):
        assert g.prompt_ids == a.prompt_ids and g.finish_reason == a.finish_reason and g.message == a.message
        assert g.logprobs == pytest.approx(a.logprobs, abs=1e-4)
    assert [len(g.completion_ids) for g in got] == [min(n, len(a.completion_ids)) for n, a in zip(limits, alone)]
    # (1 joined 0; 2 joined 1, as 0 had left; 3 and 4 joined 1 and 2; 5 came alone)
    assert sizes == [(1, True), (2, True), (2, True), (4, True), (1, True)]


def test_a_row_that_joins_continues_a_finished_conversation_from_its_kept_kv(student):
    """A conversation's next step that joins while the batch still runs prefills only its new tokens: the row
    that finished leaves the batch before the newcomer is prefilled, and its KV is found. The answer is the one
    a full prefill gives."""
    from cowork_pipeline.agents.hf_agent import HFAgent

    agent = HFAgent(student, device="cpu", max_new_tokens=16)
    full = HFAgent(student, device="cpu", max_new_tokens=16, prefix_cache_mb=0)
    convs = conversations(3)
    decoding = agent.decoding()
    # (one row of three done is not worth compacting the batch for: it is still in it when the next step joins)
    decoding.admit([(k, agent.chat_prompt(c, TOOLS, n), agent.matcher(TOOLS), None, n)
                    for k, (c, n) in enumerate(zip(convs, [3, 16, 16]))])
    first = None
    while first is None:
        for key, ids, out in decoding.step():
            first = agent.generation(("chat", convs[key], TOOLS), ids, out)
    nxt = convs[0] + [{"role": "assistant", "content": first.text}, {"role": "user", "content": "and then?"}]
    decoding.admit([("next", agent.chat_prompt(nxt, TOOLS, 16), agent.matcher(TOOLS), None, 16)])
    got = {}
    while decoding.live:
        for key, ids, out in decoding.step():
            got[key] = agent.generation(("chat", nxt if key == "next" else convs[key], TOOLS), ids, out)
    assert agent._prefix_cache.hits == 1 and agent._prefix_cache.reused_tokens > len(first.prompt_ids)
    want = full.generate([(nxt, TOOLS), (convs[1], TOOLS), (convs[2], TOOLS)])
    assert [got[k].completion_ids for k in ("next", 1, 2)] == [w.completion_ids for w in want]


def test_rows_that_sample_differently_share_a_batch_each_as_it_would_alone(student):
    """Greedy rows beside sampled ones at other temperatures and top_p, each recording its own number of top
    log-probs, joining one batch: each row's tokens, log-probs and top alternatives are those it gets alone."""
    from cowork_pipeline.agents.decoding import Prompt
    from cowork_pipeline.agents.hf_agent import HFAgent

    agent = HFAgent(student, device="cpu", max_new_tokens=16, prefix_cache_mb=0)
    convs = conversations(5)
    settings = [(0.0, 1.0, 0), (1.0, 1.0, 2), (0.7, 0.9, 0), (1.0, 1.0, 3), (0.0, 1.0, 1)]  # temperature, top_p, k
    decoding = agent.decoding()
    got: dict = {}

    def admit(rows):
        decoding.admit([Prompt(i, agent.chat_prompt(convs[i], TOOLS, 16), agent.matcher(TOOLS),
                               torch.Generator().manual_seed(7 + i), None, *settings[i]) for i in rows])

    admit([0, 1, 2])
    for step in range(10):
        if step == 3:
            admit([3, 4])
        for i, ids, out in decoding.step():
            got[i] = agent.generation(("chat", convs[i], TOOLS), ids, out)
    while decoding.live:
        for i, ids, out in decoding.step():
            got[i] = agent.generation(("chat", convs[i], TOOLS), ids, out)
    for i, (t, p, k) in enumerate(settings):
        (alone,) = agent.generate([(convs[i], TOOLS)], temperature=t, top_p=p, top_logprobs=k, seeds=[7 + i])
        assert got[i].completion_ids == alone.completion_ids, i
        assert got[i].logprobs == pytest.approx(alone.logprobs, abs=1e-4)
        assert got[i].sampling_logprobs == pytest.approx(alone.sampling_logprobs, abs=1e-4)
        assert [[t for t, _ in top] for top in got[i].top_logprobs] == [[t for t, _ in top] for top in alone.top_logprobs]
        assert all(len(top) == k for top in got[i].top_logprobs)


def test_a_join_that_fails_leaves_the_running_batch_as_it_was(student, monkeypatch):
    """A join that fails (out of memory while its group is prefilled, or while the caches are stacked) raises, and
    the running batch decodes on without the group, each row as it would alone; a later group joins it as usual."""
    from cowork_pipeline.agents import decoding as decoding_module
    from cowork_pipeline.agents import prefix_cache
    from cowork_pipeline.agents.hf_agent import HFAgent

    agent = HFAgent(student, device="cpu", max_new_tokens=24, prefix_cache_mb=0)
    convs = conversations(4)
    decoding = agent.decoding()
    row = lambda i: (i, agent.chat_prompt(convs[i], TOOLS, 24), agent.matcher(TOOLS), None, 24)  # noqa: E731
    decoding.admit([row(0), row(1)])
    got: dict = {}

    def step():
        for i, ids, out in decoding.step():
            got[i] = agent.generation(("chat", convs[i], TOOLS), ids, out)

    for _ in range(3):
        step()
    real_class, built = prefix_cache.buffered_layer_class(), []

    def layer_class(*args, **kw):  # (the second layer's buffer does not fit)
        built.append(1)
        if len(built) == 2:
            raise RuntimeError("out of memory")
        return real_class(*args, **kw)

    monkeypatch.setattr(prefix_cache, "buffered_layer_class", lambda: layer_class)
    width, attn = decoding.cur, decoding.full_attn.clone()
    with pytest.raises(RuntimeError, match="out of memory"):
        decoding.admit([row(2)])
    monkeypatch.undo()
    assert decoding.size == 2 and decoding.cur == width and torch.equal(decoding.full_attn, attn)
    assert all(type(layer) is real_class for layer in decoding.cache.layers)

    def failing_prefill(*args, **kw):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(decoding_module.Decoding, "_prefill", failing_prefill)
    with pytest.raises(RuntimeError, match="out of memory"):
        decoding.admit([row(2)])
    monkeypatch.undo()
    step()
    decoding.admit([row(3)])
    while decoding.live:
        step()
    alone = agent.generate([(convs[i], TOOLS) for i in (0, 1, 3)])
    assert sorted(got) == [0, 1, 3]
    assert [got[i].completion_ids for i in (0, 1, 3)] == [a.completion_ids for a in alone]


@pytest.mark.parametrize("sampled", [True, False], ids=["sampled", "greedy"])
def test_rows_of_a_step_out_of_memory_go_on_in_a_smaller_batch_and_end_as_they_would_have(student, sampled, caplog):
    """A decode step that fails takes the batch's rows out, each with what it drew, and they decode on in batches
    of half the size, prefilled again (here that prefill fails too, and the batch halves again): every row's
    tokens and log-probs are those it gets alone, from its own random stream or greedily, under the tools'
    grammar, to its own limit. A resumed row's KV, kept when it is done, continues its conversation."""
    from cowork_pipeline.agents.hf_agent import HFAgent

    agent = HFAgent(student, device="cpu", max_new_tokens=24)
    full = HFAgent(student, device="cpu", max_new_tokens=24, prefix_cache_mb=0)
    convs, limits = conversations(6), [24, 5, 18, 9, 24, 14]
    temperature = 1.0 if sampled else 0.0
    alone = [full.generate([(c, TOOLS)], temperature=temperature, max_new_tokens=n,
                           **({"seeds": [100 + i]} if sampled else {}))[0]
             for i, (c, n) in enumerate(zip(convs, limits))]
    flaky = agent.model = Flaky(agent.model, rows=2)
    decoding = agent.decoding(temperature=temperature)
    decoding.admit([(i, agent.chat_prompt(convs[i], TOOLS, limits[i]), agent.matcher(TOOLS),
                     torch.Generator().manual_seed(100 + i) if sampled else None, limits[i]) for i in range(6)])
    flaky.armed = True
    got = {}
    while decoding.live:
        for i, ids, out in decoding.step():
            assert not isinstance(out, Exception), out
            got[i] = agent.generation(("chat", convs[i], TOOLS), ids, out)
    # (six rows' step failed; three rows' prefill failed; then one row at a time)
    assert [f[0] for f in flaky.failures] == [6, 3] and flaky.failures[0][1] == 1 and decoding.cap == 1
    assert [r.getMessage().split(" (")[0] for r in caplog.records if r.name.endswith("decoding")] == [
        "a decode step of 6 rows failed", "the prefill of 3 rows beside 0 failed"]
    for i, a in enumerate(alone):
        assert got[i].completion_ids == a.completion_ids, i
        assert got[i].finish_reason == a.finish_reason and got[i].message == a.message
        assert got[i].logprobs == pytest.approx(a.logprobs, abs=1e-4)
    # a resumed row's conversation goes on from the KV kept when it was done (prompt and tokens prefilled
    # together, then the tokens it fed): the answer a full prefill gives
    k = max(range(6), key=lambda i: len(got[i].completion_ids))
    nxt = convs[k] + [{"role": "assistant", "content": got[k].text}, {"role": "user", "content": "and then?"}]
    flaky.armed, hits = False, agent._prefix_cache.hits
    assert agent.generate([(nxt, TOOLS)])[0].completion_ids == full.generate([(nxt, TOOLS)])[0].completion_ids
    assert agent._prefix_cache.hits == hits + 1


def test_a_batch_whose_prefill_runs_out_of_memory_is_prefilled_in_halves(student):
    """``generate``'s batch, where its prefill fails (the device out of memory past two rows), is prefilled in
    groups half the size, then one row at a time: every row's tokens are those it gets alone."""
    from cowork_pipeline.agents.hf_agent import HFAgent

    agent = HFAgent(student, device="cpu", max_new_tokens=16, prefix_cache_mb=0)
    convs = conversations(6)
    alone = [agent.generate([(c, TOOLS)])[0] for c in convs]
    flaky = agent.model = Flaky(agent.model, rows=2)
    flaky.armed = True
    got = agent.generate([(c, TOOLS) for c in convs])
    assert [f[0] for f in flaky.failures] == [6, 3]  # (the six rows' prefill, then three's; then one at a time)
    assert [g.completion_ids for g in got] == [a.completion_ids for a in alone]
    assert [g.message for g in got] == [a.message for a in alone]


def test_a_row_that_fails_alone_fails_and_nothing_loops(student):
    """A step that fails however few rows it has (not memory: a broken device, say) fails each row once it fails
    alone, with the error, after halving the batch down to one row; ``generate`` raises it."""
    from cowork_pipeline.agents.hf_agent import HFAgent

    agent = HFAgent(student, device="cpu", max_new_tokens=12, prefix_cache_mb=0)
    convs = conversations(4)
    flaky = agent.model = Flaky(agent.model, rows=0)
    decoding = agent.decoding()
    decoding.admit([(i, agent.chat_prompt(c, TOOLS, 12), agent.matcher(TOOLS)) for i, c in enumerate(convs)])
    flaky.armed = True
    ended = {}
    while decoding.live:
        ended.update((i, out) for i, _ids, out in decoding.step())
    assert sorted(ended) == [0, 1, 2, 3]
    assert all(isinstance(out, RuntimeError) and "out of memory" in str(out) for out in ended.values())
    # (the step of four rows; the prefill of two, in the prompt prefix they share, prefilled once; each row's own)
    assert [f[0] for f in flaky.failures] == [4, 1, 1, 1, 1, 1]
    with pytest.raises(RuntimeError, match="out of memory"):
        agent.generate([(c, TOOLS) for c in convs[:2]])


def _cases():
    from cowork_pipeline.capabilities import load_catalog
    from cowork_pipeline.services import FaultConfig
    from cowork_pipeline.synthesis.embedded import EmbeddedBackend

    catalog, backend = load_catalog(), EmbeddedBackend()
    envs = [backend.draft(catalog[c], s).spec for c in ("invoice_dispute", "meeting_reschedule", "schedule_meeting",
                                                        "ticket_triage_followup", "share_doc_internal") for s in (1, 2)]
    return [(env, FaultConfig(rate=0.2, seed=k) if k % 2 else None) for k, env in enumerate(envs)]


@pytest.fixture(scope="module")
def warm_student(tmp_path_factory):
    """A tiny student fine-tuned on the teacher's episodes of ``_cases``' environments: it calls their tools."""
    from cowork_pipeline.agents.chat_format import render_conversation
    from cowork_pipeline.demonstrations import EmbeddedTeacher, _clean
    from cowork_pipeline.runner import run_episode
    from cowork_pipeline.training.sft import SFTSettings, train_sft
    from cowork_pipeline.training.student import StudentConfig, build_student

    demos = []
    for env, _faults in _cases():
        traj = run_episode(env, EmbeddedTeacher(env))
        demos.append({"messages": [_clean(m) for m in traj.messages], "tools": tools_for(env.tools)})
    base = build_student([render_conversation(d["messages"], d["tools"]) for d in demos], tmp_path_factory.mktemp("base"),
                         StudentConfig(vocab_size=768, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=2,
                                       num_kv_heads=1, max_position_embeddings=4096, min_frequency=1, seed=0))
    return train_sft(base, demos * 2, tmp_path_factory.mktemp("sft"), SFTSettings(
        max_steps=120, lr=1e-2, batch_size=2, max_length=4096, device="cpu", warmup=0.0)).checkpoint


def _admissions(monkeypatch):
    """The number of live rows each admission found in the batch it joined."""
    from cowork_pipeline.agents.decoding import Decoding

    seen, admit = [], Decoding._admit_rows

    def counted(self, rows):
        seen.append(sum(not row.done for row in self.batch))
        return admit(self, rows)

    monkeypatch.setattr(Decoding, "_admit_rows", counted)
    return seen


def test_episodes_driven_continuously_are_the_episodes_lockstep_runs(warm_student, monkeypatch):
    """``run_episodes`` hands an HFAgent each episode's next turn as soon as the episode is ready for it: turns join
    the running batch (multi-turn episodes, faults, tool calls), and every trajectory is the one lockstep rounds
    give, in fewer decode steps."""
    from cowork_pipeline.agents import ContinuousAgent
    from cowork_pipeline.agents.decoding import Decoding
    from cowork_pipeline.agents.hf_agent import HFAgent
    from cowork_pipeline.runner import Limits, run_episodes

    agent = HFAgent(warm_student, device="cpu", max_new_tokens=64, batch_size=4)
    assert isinstance(agent, ContinuousAgent)
    cases, limits = _cases(), Limits(max_steps_per_turn=3)
    steps, step = [0], Decoding.step

    def counted(self):
        steps[0] += 1
        return step(self)

    monkeypatch.setattr(Decoding, "step", counted)
    lockstep = run_episodes(cases, agent, limits=limits, lockstep=True)
    lockstep_steps, steps[0] = steps[0], 0
    joined = _admissions(monkeypatch)
    continuous = run_episodes(cases, agent, limits=limits)
    assert [t.messages for t in continuous] == [t.messages for t in lockstep]
    def outcome(t):  # (what the episode did: not how long its tool calls took)
        return t.termination, [{k: v for k, v in step.items() if k != "seconds"} for step in t.steps], t.faults, t.diff

    assert [outcome(t) for t in continuous] == [outcome(t) for t in lockstep]
    assert any(t.turns_completed == 2 for t in continuous)  # (multi-turn: the world changed between turns)
    assert any(t.steps for t in continuous) and any(t.faults for t in continuous)
    assert any(live for live in joined)  # (turns joined a batch that was decoding)
    assert steps[0] < lockstep_steps


def test_a_decode_step_that_fails_fails_the_turns_in_the_batch_and_the_rest_run_on(warm_student, monkeypatch):
    """A failure in a decode step ends the episodes whose turns were decoding with ``agent_error``; the episodes
    that were not start a fresh batch and run to their end."""
    from cowork_pipeline.agents.decoding import Decoding
    from cowork_pipeline.agents.hf_agent import HFAgent
    from cowork_pipeline.runner import Limits, run_episodes

    agent = HFAgent(warm_student, device="cpu", max_new_tokens=64, batch_size=4)
    cases = _cases()
    calls, step = [0], Decoding.step

    def failing(self):
        calls[0] += 1
        if calls[0] == 10:
            raise RuntimeError("out of memory")
        return step(self)

    monkeypatch.setattr(Decoding, "step", failing)
    trajectories = run_episodes(cases, agent, limits=Limits(max_steps_per_turn=3))
    failed = [t for t in trajectories if t.termination == "agent_error"]
    assert len(trajectories) == len(cases) and 1 <= len(failed) <= 4
    assert all("out of memory" in t.termination_detail for t in failed)
    assert all(t.termination != "agent_error" and t.messages[-1]["role"] != "user" for t in trajectories if t not in failed)


@pytest.mark.parametrize("decode_only", [True, False], ids=["steps", "steps-and-prefills"])
def test_episodes_whose_steps_run_out_of_memory_are_the_episodes_lockstep_runs(warm_student, decode_only):
    """Turns whose decode steps (and prefills) fail, the device out of memory past two rows, decode on in a smaller
    batch: every episode is the one lockstep rounds give without the failures."""
    from cowork_pipeline.agents.hf_agent import HFAgent
    from cowork_pipeline.runner import Limits, run_episodes

    agent = HFAgent(warm_student, device="cpu", max_new_tokens=64, batch_size=4)
    cases, limits = _cases(), Limits(max_steps_per_turn=3)
    lockstep = run_episodes(cases, agent, limits=limits, lockstep=True)
    flaky = agent.model = Flaky(agent.model, rows=2, decode_only=decode_only)
    flaky.armed = True
    continuous = run_episodes(cases, agent, limits=limits)
    assert flaky.failures and all(t.termination != "agent_error" for t in continuous)
    assert [(t.messages, t.termination, t.diff) for t in continuous] == [(t.messages, t.termination, t.diff) for t in lockstep]


def test_a_sampled_episode_is_the_same_whatever_it_is_batched_with(warm_student):
    """A sampling student's turns draw from streams seeded by their episode's seed and the turn's number: an
    episode's sample does not depend on the batch it decodes in, and episodes with other seeds sample differently."""
    from cowork_pipeline.agents.hf_agent import HFAgent
    from cowork_pipeline.runner import Limits, run_episodes

    cases, limits = _cases()[:6], Limits(max_steps_per_turn=3)
    seeds = list(range(100, 106))
    samples = [[t.messages for t in run_episodes(cases, HFAgent(warm_student, device="cpu", max_new_tokens=48,
                                                                  temperature=1.0, batch_size=batch), limits=limits, seeds=s)]
               for batch, s in ((4, seeds), (2, seeds), (4, [s + 50 for s in seeds]))]
    assert samples[0] == samples[1]
    assert samples[0] != samples[2]
