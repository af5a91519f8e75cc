"""Helpers the tests share: trials, fixtures for servers, child-process scripts."""
