module riverlog.test/goliftbridge

go 1.21

require (
	github.com/liftbridge-io/go-liftbridge/v2 v2.3.0
	github.com/liftbridge-io/liftbridge-api v1.8.0
	github.com/nats-io/nats.go v1.37.0
	github.com/serialx/hashring v0.0.0-20200727003509-22c0c7ab6b1b
	google.golang.org/grpc v1.45.0
)

require (
	github.com/golang/protobuf v1.5.2 // indirect
	github.com/klauspost/compress v1.17.2 // indirect
	github.com/nats-io/nkeys v0.4.7 // indirect
	github.com/nats-io/nuid v1.0.1 // indirect
	golang.org/x/crypto v0.18.0 // indirect
	golang.org/x/net v0.10.0 // indirect
	golang.org/x/sys v0.16.0 // indirect
	golang.org/x/text v0.14.0 // indirect
	google.golang.org/genproto v0.0.0-20220310185008-1973136f34c6 // indirect
	google.golang.org/protobuf v1.27.1 // indirect
)
