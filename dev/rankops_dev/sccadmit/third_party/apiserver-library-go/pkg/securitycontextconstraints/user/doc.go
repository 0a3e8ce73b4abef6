// Package user contains security context constraints user strategy implementations.
package user
