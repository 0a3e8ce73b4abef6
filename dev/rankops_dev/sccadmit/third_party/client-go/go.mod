module github.com/openshift/client-go

go 1.24.0
