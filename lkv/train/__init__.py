"""Stage 4, training: the LightningModule, the label DataModule, callbacks, LightningCLI wiring and export."""
