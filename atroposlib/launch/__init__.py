"""``atropos-launch``: one YAML file runs run-api, a trainer and environments as one run.

- :mod:`atroposlib.launch.config`: the YAML schema and its validation;
- :mod:`atroposlib.launch.describe`: the resolved config as console lines at start;
- :mod:`atroposlib.launch.commands`: the command line of each part;
- :mod:`atroposlib.launch.wiring`: what each part is told about the others (servers, keys);
- :mod:`atroposlib.launch.readiness`: whether a started part answers yet;
- :mod:`atroposlib.launch.supervision`: starting, watching and stopping parts, log prefixes;
- :mod:`atroposlib.launch.orchestration`: the order of a run;
- :mod:`atroposlib.launch.ray_cluster` (``--ray``, needs ``atroposlib[ray]``): each part as a Ray
  actor placed by its section's ``placement``; :mod:`atroposlib.launch.part_host` is what that
  actor runs on its node;
- :mod:`atroposlib.launch.trainers`: trainers by name (the ``atroposlib.trainers`` entry points).

The console script is :mod:`atroposlib.cli.launch`.
"""
