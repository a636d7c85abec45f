"""More draws after a run (``draw_more``, ``draw_until``) and ``run_nuts(..., time_limit=)``.

The batches must continue the chains (no new warm-up: the adapted step size is kept), hold the
earlier draws and the new ones together for every reader of the run, and the continued chains
must still sample the target: a Normal whose mean and variance are known.
"""

from __future__ import annotations

import time

import jax
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import MCMC, NUTS

from numpyro_dpgm import Laplace, MarkovNetwork, Measurement
from numpyro_dpgm.infer.bayes import ConvergenceWarning, noisy_marginals_model, run_nuts
from numpyro_dpgm.infer.bayes.checks import ConvergenceFigures, converged
from numpyro_dpgm.infer.bayes.extend import draw_more, draw_until, first_draws

MEAN, SD = 1.5, 2.0


def _normal_model():
    numpyro.sample("x", dist.Normal(MEAN, SD))


def _run(num_chains: int = 2, num_samples: int = 200) -> MCMC:
    mcmc = MCMC(NUTS(_normal_model), num_warmup=200, num_samples=num_samples,
                num_chains=num_chains, chain_method="sequential", progress_bar=False)
    mcmc.run(jax.random.key(0), extra_fields=("adapt_state.step_size", "num_steps"))
    return mcmc


def test_draw_more_appends_a_batch_of_the_same_chains():
    mcmc = _run()
    first = np.asarray(mcmc.get_samples(group_by_chain=True)["x"])
    step = np.asarray(mcmc.get_extra_fields(group_by_chain=True)["adapt_state.step_size"])
    seconds = draw_more(mcmc, ("adapt_state.step_size", "num_steps"))
    assert seconds > 0
    grouped = np.asarray(mcmc.get_samples(group_by_chain=True)["x"])
    assert grouped.shape == (2, 400)
    np.testing.assert_array_equal(grouped[:, :200], first)  # the earlier draws are kept
    assert not np.array_equal(grouped[:, 200:], first)
    assert mcmc.get_samples()["x"].shape == (800,)  # flat: chains × draws
    fields = mcmc.get_extra_fields(group_by_chain=True)
    assert fields["num_steps"].shape == (2, 400)
    # no new warm-up: every draw of the batch uses the step size each chain adapted
    after = np.asarray(fields["adapt_state.step_size"])
    np.testing.assert_allclose(after[:, 200:], np.repeat(step[:, -1:], 200, axis=1))


@pytest.mark.parametrize("num_chains", [1, 3])
def test_first_draws_are_runs_draws_in_the_batches_program(num_chains: int):
    """From one warm-up state and key, :func:`first_draws` draws what ``mcmc.run`` draws (every
    field, every chain), and a batch after it reuses its compiled program."""
    from numpyro_dpgm.infer.bayes.extend import SequentialChains

    fields = ("adapt_state.step_size", "num_steps")
    runs = []
    for draw in ("run", "first_draws"):
        mcmc = MCMC(NUTS(_normal_model), num_warmup=100, num_samples=60, num_chains=num_chains,
                    chain_method=SequentialChains(), progress_bar=False)
        mcmc.warmup(jax.random.key(0), extra_fields=fields, collect_warmup=False)
        mcmc.post_warmup_state = mcmc.last_state
        if draw == "run":
            mcmc.run(jax.random.key(1), extra_fields=fields)
        else:
            assert first_draws(mcmc, jax.random.key(1), (), {}, fields) > 0
        runs.append(mcmc)
    ran, drew = runs
    np.testing.assert_allclose(drew.get_samples(group_by_chain=True)["x"],
                               ran.get_samples(group_by_chain=True)["x"], rtol=1e-12)
    for name in ("diverging", *fields):
        np.testing.assert_array_equal(drew.get_extra_fields(group_by_chain=True)[name],
                                      ran.get_extra_fields(group_by_chain=True)[name])
    np.testing.assert_allclose(drew.last_state.z["x"], ran.last_state.z["x"], rtol=1e-12)
    draw_more(drew, fields)
    assert drew.get_samples(group_by_chain=True)["x"].shape == (num_chains, 120)
    assert len(drew._draw_more_programs) == 1  # the batch ran the first draws' program


def test_first_draws_needs_a_warm_up():
    mcmc = MCMC(NUTS(_normal_model), num_warmup=10, num_samples=10, progress_bar=False)
    with pytest.raises(ValueError, match="post_warmup_state"):
        first_draws(mcmc, jax.random.key(0))


def test_continued_chains_still_sample_the_target():
    mcmc = _run(num_chains=2, num_samples=500)
    for _ in range(3):
        draw_more(mcmc, ("adapt_state.step_size", "num_steps"))
    x = np.asarray(mcmc.get_samples()["x"])
    assert x.shape == (4000,)
    ess = float(numpyro.diagnostics.effective_sample_size(
        np.asarray(mcmc.get_samples(group_by_chain=True)["x"])))
    assert ess > 500
    # mean within 5 Monte Carlo standard errors; sd within 10 %
    assert abs(x.mean() - MEAN) < 5 * SD / np.sqrt(ess)
    assert abs(x.std() / SD - 1) < 0.10


def test_draw_more_needs_a_run():
    mcmc = MCMC(NUTS(_normal_model), num_warmup=10, num_samples=10, progress_bar=False)
    with pytest.raises(ValueError, match="call mcmc.run"):
        draw_more(mcmc)
    thinned = MCMC(NUTS(_normal_model), num_warmup=10, num_samples=10, thinning=2,
                   progress_bar=False)
    thinned.run(jax.random.key(0))
    with pytest.raises(ValueError, match="without thinning"):
        draw_more(thinned)


def test_draw_until_stops_when_done_and_before_the_deadline():
    mcmc = _run(num_chains=1, num_samples=50)
    seen = []
    batches = draw_until(mcmc, lambda m: m.get_samples()["x"].shape[0] >= 200,
                         time.perf_counter() + 600, 0.0, ("adapt_state.step_size", "num_steps"),
                         callback=lambda m, b: seen.append((b, m.get_samples()["x"].shape[0])))
    assert batches == 3 and seen == [(1, 50), (2, 100), (3, 150)]
    assert mcmc.get_samples()["x"].shape == (200,)
    # a batch whose first draw is expected to end after the deadline does not start
    assert draw_until(mcmc, lambda m: False, time.perf_counter() + 5.0, 10.0,
                      ("adapt_state.step_size", "num_steps")) == 0
    assert mcmc.get_samples()["x"].shape == (200,)


def _slow_model():
    """A Normal whose every density evaluation sleeps 2 ms on the host: a draw costs NUTS's
    steps times that, whatever a forecast said."""
    def slow(x):
        time.sleep(0.002)
        return x

    x = numpyro.sample("x", dist.Normal(MEAN, SD))
    numpyro.factor("slow", jax.pure_callback(slow, jax.ShapeDtypeStruct((), x.dtype),
                                             0.0 * jax.lax.stop_gradient(x)))


def test_draws_stop_at_the_deadline_when_they_cost_more_than_forecast():
    """The first draws and a batch run in calls of at most ``DRAW_CHUNK`` draws with the clock
    checked between them: with a forecast far too low (1 µs a draw) they stop within about one
    call of the deadline, where one call of all the draws would have run on."""
    from numpyro_dpgm.infer.bayes.extend import DRAW_CHUNK, draws_held

    mcmc = MCMC(NUTS(_slow_model), num_warmup=20, num_samples=2000, progress_bar=False)
    from numpyro_dpgm.infer.bayes.warmup import bounded_warmup

    bounded_warmup(mcmc, jax.random.key(0), (), {}, deadline=float("inf"))
    start = time.perf_counter()
    first_draws(mcmc, jax.random.key(1), deadline=start + 2.0, pace=1e-6)
    spent = time.perf_counter() - start
    held = draws_held(mcmc)
    assert DRAW_CHUNK <= held < 2000
    assert spent < 2.0 + 2 * mcmc.draw_pace * DRAW_CHUNK + 1.0  # one call past, compile slack
    # a batch the deadline cuts is the last one draw_until draws
    start = time.perf_counter()
    assert draw_until(mcmc, lambda m: False, start + 1.0, mcmc.draw_pace) == 1
    assert held < draws_held(mcmc) < held + 2000  # cut short of its 2,000
    assert time.perf_counter() - start < 1.0 + 2 * mcmc.draw_pace * DRAW_CHUNK


def test_converged_needs_both_rhat_and_ess():
    assert converged(ConvergenceFigures(1.009, 401.0, "phi[0]", 0, 1000))
    assert not converged(ConvergenceFigures(1.011, 900.0, "phi[0]", 0, 1000))
    assert not converged(ConvergenceFigures(1.001, 399.0, "phi[0]", 0, 1000))
    assert not converged(ConvergenceFigures(float("nan"), float("nan"), "", 0, 0))
    assert converged(ConvergenceFigures(1.001, 120.0, "phi[0]", 0, 1000), min_ess=100)


def _tiny_model():
    net = MarkovNetwork({"a": 2, "b": 3}, [("a", "b")])
    y = np.array([30.0, 52.0, 21.0, 44.0, 12.0, 41.0])
    return noisy_marginals_model(net, [Measurement(("a", "b"), y, Laplace(2.0))], 200)


def test_run_nuts_draws_batches_until_converged():
    model = _tiny_model()
    with pytest.warns(ConvergenceWarning):
        fixed = run_nuts(model, jax.random.key(3), num_warmup=100, num_samples=50,
                         num_chains=2, exact=False)
    assert fixed.batches == 0 and fixed.get_samples()["phi"].shape[0] == 100
    assert not converged(fixed.convergence)  # 100 draws cannot give a bulk ESS of 400
    mcmc = run_nuts(model, jax.random.key(3), num_warmup=100, num_samples=50, num_chains=2,
                    exact=False, time_limit=300)
    assert mcmc.batches >= 1
    assert mcmc.get_samples()["phi"].shape[0] == 100 * (1 + mcmc.batches)
    # the phases' seconds: each positive, together within the run
    phases = (mcmc.warmup_seconds, mcmc.draws_seconds, mcmc.batches_seconds)
    assert min(phases) > 0 and sum(phases) <= 300
    assert mcmc.convergence.num_draws == 100 * (1 + mcmc.batches)
    assert converged(mcmc.convergence)
    # it stopped at the first batch that met the aim
    shorter = mcmc.get_samples(group_by_chain=True)
    from numpyro_dpgm.infer.bayes.checks import convergence_figures

    cut = {k: v[:, :-50] for k, v in shorter.items()}
    assert not converged(convergence_figures(cut, ["phi", "theta", "n"]))


def test_run_nuts_auto_chain_method_follows_the_devices():
    from numpyro_dpgm.infer.bayes.extend import resolve_chain_method as _chain_method

    devices = jax.local_device_count()
    assert _chain_method("auto", 1) == "sequential"
    assert _chain_method("auto", devices + 1) == "sequential"
    assert _chain_method("auto", 2) == ("parallel" if devices >= 2 else "sequential")
    assert _chain_method("vectorized", 2) == "vectorized"


def test_sequential_chains_compile_once_and_draw_what_sequential_draws():
    """Three chains in one program: NumPyro's ``"sequential"`` traces its sampling loop once
    per chain, :class:`SequentialChains` once in all; the draws and the extra fields are the
    same, key for key."""
    from jax import monitoring

    from numpyro_dpgm.infer.bayes.extend import SequentialChains

    traces: list[str] = []

    def count(event: str, duration: float, **kwargs) -> None:
        if event == "/jax/core/compile/jaxpr_trace_duration":
            traces.append(event)

    monitoring.register_event_duration_secs_listener(count)
    runs = {}
    for name, method in (("numpyro", "sequential"), ("one program", SequentialChains())):
        mcmc = MCMC(NUTS(_normal_model), num_warmup=50, num_samples=50, num_chains=3,
                    chain_method=method, progress_bar=False)
        traces.clear()
        mcmc.run(jax.random.key(3), extra_fields=("num_steps",))
        runs[name] = (len(traces), mcmc.get_samples(group_by_chain=True)["x"],
                      mcmc.get_extra_fields(group_by_chain=True)["num_steps"])
    monitoring.unregister_event_duration_listener(count)
    (seq_traces, seq_x, seq_steps), (one_traces, one_x, one_steps) = runs.values()
    assert one_x.shape == (3, 50)
    np.testing.assert_allclose(np.asarray(one_x), np.asarray(seq_x), rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(np.asarray(one_steps), np.asarray(seq_steps))
    assert one_traces < seq_traces, (one_traces, seq_traces)


def test_warm_up_and_the_draws_of_chains_in_turn_compile_the_sampler_once(caplog):
    """Warm-up (:func:`bounded_warmup`), the first draws and a further batch of chains run one
    after another step one compiled program (:func:`step_program`): JAX's compile log names
    it once, where warm-up and the draws used to compile a program each."""
    import logging

    from numpyro_dpgm.infer.bayes.extend import SequentialChains
    from numpyro_dpgm.infer.bayes.warmup import bounded_warmup

    mcmc = MCMC(NUTS(_normal_model), num_warmup=30, num_samples=30, num_chains=2,
                chain_method=SequentialChains(), progress_bar=False)
    fields = ("num_steps",)
    with caplog.at_level(logging.WARNING), jax.log_compiles(True):
        bounded_warmup(mcmc, jax.random.key(0), (), {}, deadline=float("inf"),
                       extra_fields=fields)
        first_draws(mcmc, jax.random.key(1), extra_fields=fields)
        draw_more(mcmc, fields)
    compiled = [r.getMessage() for r in caplog.records
                if r.getMessage().startswith("Finished XLA compilation of")]
    assert sum("jit(chain)" in m for m in compiled) == 1, compiled
    assert not any("jit(step)" in m or "jit(<lambda>)" in m for m in compiled), compiled
    assert mcmc.get_samples(group_by_chain=True)["x"].shape == (2, 60)
