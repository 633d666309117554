"""The capacity planner: many simulations (a local process pool or Ray) -> the cheapest fleet that
meets the SLOs.

    plan = load_plan("examples/plan_h100_a100.yaml")
    result = run_plan(plan, make_runner(workers=2))     # the dict written as plan.json

Stage 1 measures each candidate's capacity per replica (simulator.planner.search), stage 2 sizes the
static fleet at the peak and runs each policy over the whole curve (simulator.planner.stages).
"""
