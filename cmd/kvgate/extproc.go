package main

import "context"

// runExtproc is replaced when its package lands.
func runExtproc(ctx context.Context, args []string) error { return errNotBuilt }
