"""Suite-wide settings: hypothesis is derandomized in CI and randomized locally.

Under `CI=true` every property runs from a fixed seed, so a run is reproducible; locally it
explores new inputs. A failure hypothesis ever finds is kept as an explicit `@example`.
Neither profile has a deadline. `WARREN_NO_SERVER=1` for every test: no test uses or
starts the user's warm server.
"""

import os

from hypothesis import settings

# No test run talks to, or starts, the user's warm server; tests/orchestrator/server/ runs
# private servers of its own (WARREN_SERVER_DIR) and lifts this for their clients.
os.environ["WARREN_NO_SERVER"] = "1"

# No deadline: a shared 2-core machine makes first calls (imports, compiled patterns) slow at
# random, and speed is measured by tests/bench/, not by timed assertions.
settings.register_profile("ci", derandomize=True, print_blob=True, deadline=None)
settings.register_profile("dev", print_blob=True, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") == "true" else "dev")
