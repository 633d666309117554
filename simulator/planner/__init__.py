"""The capacity planner: many simulations (a local process pool or Ray) -> the cheapest fleet that
meets the SLOs.

    from simulator.planner.plan import load_plan            # the plan file, validated
    from simulator.planner.stages import run_plan           # every simulation of it -> plan.json's dict
    from simulator.planner.sweep import make_runner         # a process pool, Ray, or this process

    result = run_plan(load_plan("examples/plan_h100_a100.yaml"), make_runner(workers=2))

Stage 1 measures each candidate's capacity per replica (simulator.planner.capacity, on the searches of
simulator.planner.search), stage 2 sizes the static fleet at the peak and runs each policy over the
whole curve (simulator.planner.stages); simulator.planner.rank prices and ranks them,
simulator.planner.report writes the folder. simulator.planner.compare runs one scenario under several
policies.
"""
