"""Joint checkpointing over folders and gathered reports: no trainer, no process group."""

import json
import logging
import os

import pytest

from hacpo_trl.run.checkpoints import (
    STATE_FILE,
    check_same_start,
    complete_checkpoints,
    prune_checkpoints,
    read_state,
    resume_checkpoint,
    write_state,
)


def test_save_total_limit_counts_only_complete_checkpoints(tmp_path):
    def folder(step, complete):
        path = tmp_path / f"checkpoint-{step}"
        path.mkdir()
        (path / "model.safetensors").write_bytes(b"x")
        if complete:
            (path / "hacpo_state.json").write_text("{}")

    # 2, 4, 8 complete; 6 interrupted while saving; 10 is being written by a newer save
    for step, complete in ((2, True), (4, True), (6, False), (8, True), (10, False)):
        folder(step, complete)
    (tmp_path / "checkpoint-best").mkdir()  # not a step: never touched
    deleted = prune_checkpoints(str(tmp_path), limit=2, keep=str(tmp_path / "checkpoint-2"))
    assert sorted(os.path.basename(p) for p in deleted) == ["checkpoint-6"]
    assert sorted(complete_checkpoints(str(tmp_path))) == [2, 4, 8]
    deleted = prune_checkpoints(str(tmp_path), limit=1)
    assert sorted(os.path.basename(p) for p in deleted) == ["checkpoint-2", "checkpoint-4"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-10", "checkpoint-8", "checkpoint-best"]
    assert prune_checkpoints(str(tmp_path / "missing"), limit=1) == []


def test_state_written_atomically_and_read_back(tmp_path):
    state = {"agent": "A", "global_step": 4, "capability": {"steps": 4}}
    write_state(str(tmp_path), state)
    assert sorted(os.listdir(tmp_path)) == [STATE_FILE]  # no temporary file left behind
    assert json.loads((tmp_path / STATE_FILE).read_text()) == state == read_state(str(tmp_path), "A")
    assert complete_checkpoints(str(tmp_path.parent)) == {}  # not a checkpoint-<step> folder


def test_reading_an_interrupted_checkpoint_names_it(tmp_path):
    with pytest.raises(ValueError, match=f"agent 'A': {tmp_path} has no {STATE_FILE}.*saving it was interrupted"):
        read_state(str(tmp_path), "A")


def describe(rank):
    return f"process {rank}"


# one (agent, is_agent_main_process, complete steps, resume_from_checkpoint) per process, in global-rank order
A_MAIN, A_OTHER = ("A", True, [2, 4, 6], True), ("A", False, [2, 4, 6], True)
B_MAIN = ("B", True, [2, 4], True)


def test_resume_from_the_newest_step_every_agent_completed(caplog):
    complete = {2: "a/checkpoint-2", 4: "a/checkpoint-4", 6: "a/checkpoint-6"}
    with caplog.at_level(logging.WARNING, logger="hacpo_trl.run.checkpoints"):
        assert resume_checkpoint("A", complete, [A_MAIN, A_OTHER, B_MAIN], describe) == "a/checkpoint-4"
    assert "agent 'A': resuming from step 4, not from incomplete or unshared [6]" in caplog.text
    caplog.clear()
    assert resume_checkpoint("B", {2: "b/2", 4: "b/4"}, [A_MAIN, A_OTHER, B_MAIN], describe) == "b/4"
    assert not caplog.text


def test_resume_without_a_common_step_refuses():
    everyone = [("A", True, [6], True), ("B", True, [2, 4], True)]
    with pytest.raises(ValueError, match=r"no step was saved completely by every agent .*'A': \[6\], 'B': \[2, 4\]"):
        resume_checkpoint("A", {6: "a/6"}, everyone, describe)


def test_resume_where_a_process_cannot_see_the_checkpoint_names_it():
    # A's second process is on a node without the shared filesystem: it sees no checkpoint of A at all
    everyone = [A_MAIN, ("A", False, [], True), B_MAIN]
    with pytest.raises(ValueError, match="resuming from step 4, but process 1 cannot see a complete checkpoint-4"):
        resume_checkpoint("A", {4: "a/4"}, everyone, describe)


def test_agents_must_start_from_one_step():
    check_same_start([("A", 4), ("A", 4), ("B", 4)])
    check_same_start([("A", 0), ("B", 0)])
    with pytest.raises(ValueError, match=r"agents would resume from different steps: \[\('A', 2\), \('B', 4\)\]"):
        check_same_start([("A", 2), ("A", 2), ("B", 4)])


def test_save_state_completes_a_step_and_resume_from_checkpoint_is_read(tmp_path):
    from hacpo_trl.run.checkpoints import chosen_checkpoint, save_state

    (tmp_path / "checkpoint-4").mkdir()
    save_state(str(tmp_path), "A", 4, {"steps": 4})
    assert complete_checkpoints(str(tmp_path)) == {4: str(tmp_path / "checkpoint-4")}
    assert read_state(str(tmp_path / "checkpoint-4"), "A") == {
        "agent": "A",
        "global_step": 4,
        "capability": {"steps": 4},
    }
    complete, everyone = {2: "a/2", 4: "a/4"}, [("A", True, [2, 4], True), ("B", True, [2], True)]
    for requested, expected in ((True, "a/2"), ("last", "a/2"), ("a/4", "a/4"), (None, None), (False, None)):
        assert chosen_checkpoint(requested, "A", complete, everyone, describe) == expected, requested


def test_restore_state_and_the_deferred_save_total_limit(tmp_path):
    from types import SimpleNamespace

    from hacpo_trl.algorithm import CapabilityTracker
    from hacpo_trl.run.checkpoints import deferred_limit, restore_state, save_state

    saved = CapabilityTracker(["A", "B"])
    saved.update({"A": [1, 0], "B": [1, 1]})
    (tmp_path / "checkpoint-6").mkdir()
    save_state(str(tmp_path), "A", 6, saved.state_dict())
    fresh = CapabilityTracker(["A", "B"])
    assert restore_state(str(tmp_path / "checkpoint-6"), "A", fresh) == 6
    assert fresh.capabilities() == saved.capabilities() != CapabilityTracker(["A", "B"]).capabilities()
    assert restore_state(None, "A", fresh) == 0
    args = SimpleNamespace(save_total_limit=3)
    with pytest.raises(RuntimeError), deferred_limit(args) as limit:
        assert (limit, args.save_total_limit) == (3, None)  # TRL's save deletes nothing
        raise RuntimeError("interrupted")
    assert args.save_total_limit == 3


def test_saving_and_resuming_together_over_the_exchange(tmp_path, capsys):
    """The trainer's joint protocol, with the exchange's all-gather played by hand for agents A (this process) and
    B: a step's tracker is written before every agent is waited for, old steps are pruned only after that, and a
    resume takes the newest step both saved, restores the tracker and says so on the agent's main process."""
    from hacpo_trl.algorithm import CapabilityTracker
    from hacpo_trl.run.checkpoints import resume_together, save_together

    calls = []

    def gather(obj, what):  # B answers as if it had saved steps 2 and 4, and resumes where A does
        calls.append((what, sorted(os.listdir(tmp_path))))
        if what == "checkpoints to resume from":
            return [obj, ("B", True, [2, 4], obj[3], "runs/B")]
        return [obj, ("B", obj[1])]

    tracker = CapabilityTracker(["A", "B"])
    for step in (2, 4, 6):
        (tmp_path / f"checkpoint-{step}").mkdir()
        tracker.update({"A": [1, step > 2], "B": [1, 1]})
        save_together(str(tmp_path), "A", step, tracker.state_dict(), True, gather, limit=2)
    assert calls[-1] == ("checkpoint saved by every agent", ["checkpoint-2", "checkpoint-4", "checkpoint-6"])
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-4", "checkpoint-6"]  # pruned once B had saved step 6 too
    fresh = CapabilityTracker(["A", "B"])
    assert resume_together(True, "A", str(tmp_path), True, gather, describe, fresh) == str(tmp_path / "checkpoint-4")
    assert capsys.readouterr().out == f"hacpo: agent 'A' resumes from {tmp_path / 'checkpoint-4'} (step 4)\n"
    assert fresh.rows() == {"A": 4, "B": 4}  # the tracker as saved at step 4: two steps of two completions each
    assert [c[0] for c in calls[-2:]] == ["checkpoints to resume from", "resume steps"]
    assert resume_together(None, "A", str(tmp_path), False, gather, describe, fresh) is None


def _saved(run, agent, *steps, owner=None):
    """``run/agent/checkpoint-<step>`` folders that finished saving (owner: the agent their state names)."""
    from hacpo_trl.run.checkpoints import save_state

    for step in steps:
        (run / agent / f"checkpoint-{step}").mkdir(parents=True)
        save_state(str(run / agent), owner or agent, step, {})
    return str(run / agent)


def test_a_resume_path_means_its_step_for_every_agent_each_from_its_own_folder(tmp_path):
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR as TRANSFORMERS_PREFIX

    from hacpo_trl.run.checkpoints import PREFIX_CHECKPOINT_DIR, agent_checkpoints

    assert PREFIX_CHECKPOINT_DIR == TRANSFORMERS_PREFIX
    dirs = {"a": _saved(tmp_path, "a", 2, 4), "b": _saved(tmp_path, "b", 2, 4)}
    mine = {a: os.path.join(d, "checkpoint-2") for a, d in dirs.items()}
    assert agent_checkpoints(str(tmp_path / "a" / "checkpoint-2"), dirs) == mine
    assert agent_checkpoints(str(tmp_path / "b" / "checkpoint-2") + "/", dirs) == mine
    assert agent_checkpoints("true", dirs) == {a: os.path.join(d, "checkpoint-4") for a, d in dirs.items()}
    assert agent_checkpoints(None, dirs) == agent_checkpoints("false", dirs) == {"a": None, "b": None}
    elsewhere = os.path.join(_saved(tmp_path / "earlier", "a", 6), "checkpoint-6")  # an earlier run of agent a
    assert agent_checkpoints(elsewhere, {"a": dirs["a"]}) == {"a": elsewhere}  # one agent may, as in TRL
    with pytest.raises(ValueError, match=r"outside every agent's output folder"):
        agent_checkpoints(elsewhere, dirs)  # two agents could only both load it


@pytest.mark.parametrize(
    "case",
    ["empty folder", "missing", "output folder", "a step one agent lacks", "another agent's", "outside", "no common"],
)
def test_a_resume_that_cannot_work_is_refused_in_one_line_naming_the_fix(tmp_path, case):
    from hacpo_trl.run.checkpoints import agent_checkpoints

    dirs = {"a": _saved(tmp_path, "a", 2, 4), "b": _saved(tmp_path, "b", 2)}
    (tmp_path / "empty").mkdir()
    requested, match = {
        "empty folder": (tmp_path / "empty", r"is not a checkpoint folder .*holds no complete checkpoint-<step>"),
        "missing": (tmp_path / "nowhere", r"is not a checkpoint folder .*it does not exist"),
        "output folder": (tmp_path / "a", r"it holds checkpoint-4, pass .*a/checkpoint-4"),
        "a step one agent lacks": (tmp_path / "a" / "checkpoint-4", r"agent 'b': .*names step 4, .*complete steps: \[2\]"),
        "another agent's": (tmp_path / "a" / "checkpoint-2", r"agent 'b': .*is a checkpoint of agent 'a'"),
        "outside": (tmp_path / "elsewhere" / "checkpoint-2", r"outside every agent's output folder"),
        "no common": ("true", r"no step was saved completely by every agent .*'a': \[2, 4\], 'b': \[\]"),
    }[case]  # fmt: skip
    if case == "another agent's":  # b's folder holds a checkpoint that agent a saved
        import shutil

        shutil.rmtree(tmp_path / "b" / "checkpoint-2")
        _saved(tmp_path, "b", 2, owner="a")
    if case == "no common":
        import shutil

        shutil.rmtree(tmp_path / "b" / "checkpoint-2")
    with pytest.raises(ValueError, match=match) as info:
        agent_checkpoints(str(requested), dirs)
    assert "\n" not in str(info.value) and ("pass" in str(info.value) or "start without" in str(info.value))
