"""rollwise.cluster: where a run's work goes beyond this process.

The trainer as one handle (`trainer_handle.py`: in-process, `train.world_size` local rank processes in
`ranks.py`, or Ray rank actors), engines and scorers as Ray actors (`ray_engines.py`, `ray_scoring.py`), and what a
Ray config asks of the cluster, checked before any actor is requested (`ray_resources.py`). Ray stays here: the
loop sees only the protocols.
"""
