"""Issue 31's isolation in virtual time (bench/batch_virtual.py): one emulated H100 engine (the real
scheduler and block manager, steps timed by the 70B latency model) at 80% of its capacity, with batch
lines kept at the engine all along. With --background-priority the interactive TTFT and TPOT p90 stay
within 10% of the load alone; with fcfs (and with vLLM's priority order alone) they do not."""

import pytest

from bench.batch_virtual import capacity, run

SECONDS = 40.0


@pytest.fixture(scope="module")
def rate():
    cap = capacity(30.0)
    assert 5.0 < cap < 12.0  # the 70B TP4 model, 1000-token prompts, 32 output tokens
    return 0.8 * cap


def change(rate, inflight, policy, background):
    alone = run(rate, SECONDS, 0, policy, background)
    beside = run(rate, SECONDS, inflight, policy, background)
    assert alone.requests == beside.requests > 100 and alone.batch_done == 0
    print(f"{policy} background={background}: TTFT p90 {alone.ttft_p90 * 1000:.0f} -> "
          f"{beside.ttft_p90 * 1000:.0f} ms, TPOT p90 {alone.tpot_p90 * 1000:.1f} -> "
          f"{beside.tpot_p90 * 1000:.1f} ms, "
          f"batch lines {beside.batch_done} during the load, {beside.batch_total} in all")
    return beside.ttft_p90 / alone.ttft_p90 - 1, beside.tpot_p90 / alone.tpot_p90 - 1, beside


def test_background_batch_lines_leave_interactive_latency_within_10_percent(rate):
    ttft, tpot, beside = change(rate, 8, "priority", 1)
    assert abs(ttft) <= 0.10 and abs(tpot) <= 0.10, (ttft, tpot)
    assert beside.batch_total >= 8  # the lines out finish (in the gaps, or after the load)


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_batch_lines_sharing_steps_raise_interactive_latency(rate, policy):
    ttft, tpot, beside = change(rate, 8, policy, None)
    # the lines run all along, in shared steps
    assert tpot > 0.15 and beside.batch_done > 100, (ttft, tpot, beside)


@pytest.mark.parametrize("load", [0.25, 0.5, 0.8])
def test_step_bounds_let_the_batch_progress_under_load_within_10_percent(rate, load):
    """--background-step-budget 3 --background-solo-step 70 (ms): 64 lines at the engine get on
    under steady interactive traffic, where background priority alone starves them."""
    r = rate / 0.8 * load
    alone = run(r, SECONDS, 0, "priority", 1)
    before = run(r, SECONDS, 64, "priority", 1)
    after = run(r, SECONDS, 64, "priority", 1, 1, 3.0, 70.0)
    ttft, tpot = after.ttft_p90 / alone.ttft_p90 - 1, after.tpot_p90 / alone.tpot_p90 - 1
    print(f"load {load:.0%}: TTFT p90 {100 * ttft:+.1f}%, TPOT p90 {100 * tpot:+.1f}%, batch lines "
          f"{before.batch_done} -> {after.batch_done}")
    assert abs(ttft) <= 0.10 and abs(tpot) <= 0.10, (ttft, tpot)
    assert after.batch_done >= max(1.4 * before.batch_done, 100), (before.batch_done, after.batch_done)
