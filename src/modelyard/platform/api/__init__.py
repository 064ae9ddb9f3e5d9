"""What every part of the REST API shares: the one error type, resource names, the fields a
request body may hold, where version aliases end up, and timestamps.

May import: the standard library and ``modelyard.errors``; nothing else of the platform (every
other part of it imports these)."""
