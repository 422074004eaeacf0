"""Holds only ms-swift's plugin file (see :func:`gpumon.integrations.swift.plugin_path`): ms-swift
puts a plugin's directory first on ``sys.path``, so the file must not sit next to modules named
like real packages (``gpumon/integrations/transformers.py``)."""
