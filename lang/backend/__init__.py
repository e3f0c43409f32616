"""Backends a program runs on: a server over the native API (RuntimeEndpoint), an in-process
Engine, or any OpenAI-compatible server (OpenAI)."""
