// Package selinux contains security context constraints SELinux strategy implementations.
package selinux
