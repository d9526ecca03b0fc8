"""A training step that asks for more GPU memory than the card has, under torchrun."""
import torch

x = torch.empty(200 * 2**30, dtype=torch.uint8, device="cuda")
