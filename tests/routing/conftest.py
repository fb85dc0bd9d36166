"""Puts tests/routing on sys.path so test modules can import `reference_scorers`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
