"""Suite-wide settings: hypothesis is derandomized in CI and randomized locally.

Under `CI=true` every property runs from a fixed seed, so a run is reproducible; locally it
explores new inputs. A failure hypothesis ever finds is kept as an explicit `@example`.
"""

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") == "true" else "dev")
