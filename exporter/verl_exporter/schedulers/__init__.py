"""Schedulers: which job a run belongs to (Slurm, Kubernetes), and service discovery."""
