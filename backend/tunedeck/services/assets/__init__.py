"""Datasets and local models: registering a dataset (its format detected), previews with the chat
template applied, the models this server can use."""
