"""kai_ray.k8s."""
