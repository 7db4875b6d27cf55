"""The mutating admission webhook (see DESIGN.md): queue, suspend, priority, flavors, gang."""
