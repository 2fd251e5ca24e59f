"""Parts of the trainer binary: start-up, checkpoints, the train and eval loops."""
