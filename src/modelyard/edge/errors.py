"""The one error type of edge conversion: a message written for the person at the terminal."""
from __future__ import annotations


class ConvertError(Exception):
    """Conversion cannot proceed; the message says why and what to do instead."""
