// Command stint is the command-line interface of stint, the task framework
// on PostgreSQL, with the built-in behaviors. Run `stint --help` for its
// commands; package cli holds them, for programs that add behaviors of
// their own.
package main

import "github.com/stinthq/stint/cli"

func main() { cli.Main(nil) }
