"""The run: where a config becomes components and the phases run.

Only this folder of `pipeline/` imports `stages/`, `gates/` and `learner/` (tests/pipeline/test_layering.py);
every other module of `pipeline/` is mechanism those folders build on. A run starts in `job.run_job`
(`python run.py`); docs/architecture.md maps the rest.
"""
