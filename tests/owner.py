"""The user the tests run as: the owner of every file they write, so of the runs those files name."""

from __future__ import annotations

import os

from verl_exporter.store.owners import user_name

ME = user_name(os.getuid())
