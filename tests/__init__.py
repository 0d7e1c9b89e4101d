"""iAs test suite: `python -m unittest discover -s tests -t .` (see tests/support.py)."""
import logging

# Keep warnings that tests provoke on purpose out of the test output (tests that check logs
# attach their own handlers).
logging.getLogger("ias").addHandler(logging.NullHandler())
