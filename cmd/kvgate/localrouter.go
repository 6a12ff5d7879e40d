package main

import "context"

// runLocalRouter is replaced when its package lands.
func runLocalRouter(ctx context.Context, args []string) error { return errNotBuilt }
