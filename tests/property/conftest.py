"""How random the property tests are.

``make test`` (and so CI) runs them derandomized: the same examples every run, so a green main stays
green and a red one is red for everyone (the Tier 1 reclaim bug in ``core/locality.py`` parked a push
only because one CI run happened to draw it). Exploring is a separate step, ``make fuzz``: fresh random
examples each run (``HYPOTHESIS_PROFILE=fuzz``), and a failure prints the blob that replays it with
``@reproduce_failure``. The tests' own ``settings`` set how many examples; the profile sets only how
they are drawn.
"""

import os

from hypothesis import settings

settings.register_profile("repeatable", derandomize=True, database=None, print_blob=True)
settings.register_profile("fuzz", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))
