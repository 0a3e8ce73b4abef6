module github.com/openshift/api

go 1.24.0
