import os
import sys

# tests import helpers as `tests.helpers`; make the repo root importable without installing
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
