"""The GPU suite: everything the project measures on a lent GPU, in one resumable command."""
