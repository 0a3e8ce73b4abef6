"""rankops: serve recommendation ranking models on Triton, safely."""
