"""The GPU suite: everything the project measures on a GPU, in one resumable command."""
