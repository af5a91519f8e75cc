"""``hookdet.tensorboard``: where Determined's ``determined.tensorboard`` names live."""
