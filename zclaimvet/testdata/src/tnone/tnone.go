// Package tnone's test file holds a poller the analyzer skips without -tests.
package tnone
