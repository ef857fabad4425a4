"""``atropos-launch``: one YAML file runs run-api, a trainer and environments as one run.

- :mod:`atroposlib.launch.config`: the YAML schema and its validation;
- :mod:`atroposlib.launch.commands`: the command line of each part;
- :mod:`atroposlib.launch.supervision`: starting, watching and stopping parts, log prefixes;
- :mod:`atroposlib.launch.orchestration`: the order of a run;
- :mod:`atroposlib.launch.trainers`: trainers by name (the ``atroposlib.trainers`` entry points).

The console script is :mod:`atroposlib.cli.launch`.
"""
