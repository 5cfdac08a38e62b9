"""kai-ray: a KAI-Scheduler-compatible GPU batch scheduler for Ray on Kubernetes."""

__version__ = "0.1.0"
