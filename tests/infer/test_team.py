"""``run_nuts(chain_method="processes")`` (:mod:`numpyro_dpgm.infer.bayes.team`): the meeting
points of a team checked over pipes in one process (what each side sends and gets), and real
teams of processes: the same posterior as one process (a second run of one target, compared
within Monte-Carlo error), and a failing member raised where the run was called."""

import os
import threading
from multiprocessing import Pipe

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.diagnostics import effective_sample_size

from numpyro_dpgm.distributions import CollectiveGraphicalModel, LaplaceNoise
from numpyro_dpgm.infer.bayes import run_nuts
from numpyro_dpgm.infer.bayes.extend import draw_more
from numpyro_dpgm.infer.bayes.team import SHARED_SETTINGS, Leader, Member, TeamError, _job
from numpyro_dpgm.network import MarkovNetwork

numpyro.enable_x64()

NET = MarkovNetwork({"a": 2, "b": 3}, [("a", "b")])
Y = jnp.array([300.0, 2, 180, 160, 350, 8])  # two nearly empty cells

two_cores = pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="a team needs two cores this process may run on")


class _Alive:
    """A stand-in for a member's process that never ends."""

    returncode = None

    def poll(self):
        return None


def _team(size):
    pipes = [Pipe() for _ in range(size - 1)]
    leader = Leader([(_Alive(), ours) for ours, _ in pipes])
    return leader, [Member(theirs) for _, theirs in pipes]


def _in_threads(fns):
    out = [None] * len(fns)

    def call(i):
        out[i] = fns[i]()

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(fns))]
    for t in threads:
        t.start()
    return threads, out


def test_pilot_draws_are_pooled_in_one_order_for_every_process():
    leader, members = _team(3)
    parts = [np.full((4, 2), float(i)) for i in range(3)]
    threads, got = _in_threads([lambda i=i, m=m: m.pool(parts[i + 1])
                                for i, m in enumerate(members)])
    pooled = leader.pool(parts[0])
    for t in threads:
        t.join()
    np.testing.assert_array_equal(pooled, np.concatenate(parts))
    for g in got:
        np.testing.assert_array_equal(g, pooled)


def test_the_check_sees_every_chain_cut_to_the_fewest_draws_and_every_member_its_verdict():
    leader, (member,) = _team(2)
    ours = {"samples": {"x": np.zeros((2, 7))}, "num_steps": np.ones((2, 7))}
    theirs = {"samples": {"x": np.ones((1, 5))}, "num_steps": np.ones((1, 5))}
    seen = []

    def decide(draws):
        seen.append(draws)
        return False

    threads, got = _in_threads([lambda: member.converged(theirs, decide)])
    assert leader.converged(ours, decide) is False
    threads[0].join()
    assert got == [False] and len(seen) == 1  # the leader decides, once
    np.testing.assert_array_equal(seen[0]["samples"]["x"],
                                  [[0] * 5, [0] * 5, [1] * 5])


def test_a_member_that_has_stopped_stops_the_team_and_join_puts_its_chains_after_ours():
    leader, (a, b) = _team(3)
    states = [{"z": {"x": np.full((2, 6), float(i))}} for i in range(3)]
    # a stops drawing (its time is up) while b asks to draw on: the team stops
    threads, got = _in_threads([lambda: a.join(states[1], {"warmup_steps": (9,)}),
                                lambda: b.converged({"samples": {}}, None)])
    assert leader.converged({"samples": {}}, lambda d: pytest.fail("no decision")) is True
    for t in threads:
        t.join()
    assert got[1] is True
    threads, _ = _in_threads([lambda: b.join(states[2], {"warmup_steps": (8,)})])
    merged, notes = leader.join(states[0])
    threads[0].join()
    np.testing.assert_array_equal(merged["z"]["x"][:, 0], [0, 0, 1, 1, 2, 2])
    assert notes == [{"warmup_steps": (9,)}, {"warmup_steps": (8,)}]


def test_a_member_that_is_gone_is_a_clear_error():
    ours, theirs = Pipe()

    class Ended:
        returncode = 3

        def poll(self):
            return 3

    leader = Leader([(Ended(), ours)])
    with pytest.raises(TeamError, match="worker process 1 ended .exit code 3."):
        leader.pool(np.zeros((1, 1)))


def test_a_member_gets_the_callers_module_path_jax_settings_and_run(tmp_path):
    import pickle
    import sys

    with _cache(tmp_path):
        job = pickle.loads(_job(len))
    assert job["path"] == sys.path and pickle.loads(job["run"]) is len
    assert set(job["settings"]) == set(SHARED_SETTINGS)
    assert job["settings"]["jax_enable_x64"] is True
    assert job["settings"]["jax_compilation_cache_dir"] == str(tmp_path)


class _cache:
    """JAX's persistent compilation cache in ``folder`` for the block."""

    def __init__(self, folder):
        self.folder, self.held = str(folder), None

    def __enter__(self):
        self.held = jax.config.jax_compilation_cache_dir
        jax.config.update("jax_compilation_cache_dir", self.folder)

    def __exit__(self, *exc):
        jax.config.update("jax_compilation_cache_dir", self.held)


def _release_model(y):
    theta = numpyro.sample("theta", dist.Normal(0.0, 3.0).expand([6]).to_event(1))
    n = numpyro.sample("n", CollectiveGraphicalModel(NET, theta, 1000))
    numpyro.sample("y", LaplaceNoise(n, 20.0), obs=y)


@two_cores
def test_a_team_samples_the_posterior_of_one_process():
    """Four chains on two processes (the pilot pooled, batches until the ESS aim) against one
    process's four chains: the same posterior means within Monte-Carlo error, one run of four
    distinct chains, every process's warm-up, and this process's cores given back."""
    cores = os.sched_getaffinity(0)
    team = run_nuts(_release_model, jax.random.key(1), Y, collapsed=True, num_chains=4,
                    num_samples=500, chain_method="processes", time_limit=120,
                    target_ess=1500, check=False)
    assert os.sched_getaffinity(0) == cores
    one = run_nuts(_release_model, jax.random.key(1), Y, collapsed=True, num_chains=4,
                   num_samples=1000, check=False)
    assert team.processes == 2 and team.num_chains == 4 and len(team.warmup_steps) == 4
    held = team.get_samples(group_by_chain=True)["theta"].shape[1]
    assert [len(n["warmup_steps"]) for n in team.team_notes] == [2, 2]
    assert min(n["draws"] for n in team.team_notes) == held  # cut to the fewest
    assert team.metric == "pilot" and team.convergence.min_ess_bulk >= 1500
    draws = team.get_samples(group_by_chain=True)
    assert draws["n"].shape[:2] == (4, draws["theta"].shape[1]) and team.batches >= 1
    assert not np.allclose(draws["theta"][0], draws["theta"][2])  # the member's own chains
    with pytest.raises(ValueError, match="team of processes"):
        draw_more(team)  # the chains' last states stayed in their processes
    for site in ("theta", "n"):
        a, b = (np.asarray(r.get_samples(group_by_chain=True)[site]) for r in (team, one))
        se = np.sqrt(sum(x.reshape(-1, x.shape[-1]).var(0) / effective_sample_size(x)
                         for x in (a, b)))
        assert (np.abs(a.mean((0, 1)) - b.mean((0, 1))) / se).max() < 4.0, site


def test_an_unknown_chain_method_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="chain_method must be one of .*'processes'"):
        run_nuts(_release_model, jax.random.key(0), Y, chain_method="threads")


@two_cores
def test_a_failing_member_is_raised_where_the_run_was_called():
    leader_pid = os.getpid()

    def model(y):
        if os.getpid() != leader_pid:
            raise RuntimeError("only the leader may run this model")
        _release_model(y)

    with pytest.raises(TeamError, match="only the leader may run this model"):
        run_nuts(model, jax.random.key(0), Y, collapsed=True, num_chains=2, num_samples=20,
                 num_warmup=20, chain_method="processes", check=False)
