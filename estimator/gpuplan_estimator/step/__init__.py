"""One training (or inference) step as work: forward, backward, optimizer, frameworks, memory."""
