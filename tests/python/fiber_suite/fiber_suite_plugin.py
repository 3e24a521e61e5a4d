"""pytest plugin of the Fiber-suite harness (loaded with -p in the master):
imports the placeholders so that `fiber.backend`, `fiber.socket` and
`fiber.docker_backend` are attributes of the fiber package, as they are
in Uber's (its tests use `fiber.backend.get_backend` without importing
it).  See sitecustomize.py."""
import fiber
import fiber.backend  # noqa: F401  (placeholders: sitecustomize.py)
import fiber.docker_backend  # noqa: F401
import fiber.socket  # noqa: F401
