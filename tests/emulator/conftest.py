"""Puts tests/emulator on sys.path so test modules can import `emu_helpers`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
