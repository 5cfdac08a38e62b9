"""kai_ray.core: the pure scheduling core (snapshot in, decisions out)."""

# True when this package was compiled by mypyc (setup.py, KAI_RAY_COMPILE=1): the compiled
# modules' __file__ is the extension module, not the .py source
COMPILED = not __file__.endswith(".py")
