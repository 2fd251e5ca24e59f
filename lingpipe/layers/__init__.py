"""lingpipe layers, one topic a module."""
