"""kai_ray.testing."""
