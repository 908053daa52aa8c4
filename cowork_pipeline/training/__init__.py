"""Student construction and fine-tuning (SFT) on teacher demonstrations."""
